"""`orch controller up|status|logs|down`: set up, inspect and stop this ORCH_HOME's host.

- `up` adopts a machine (`adopt`) or launches one local node (`launch`; an EC2 instance:
  `aws_host.launch`), installs this orch's
  wheel there (offline), writes the host's environment and starts the supervised daemon. The
  record (ORCH_HOME/controller-host/host.json) is written before the daemon starts, and for a
  launched host right after its launch, so `down` can always find what `up` left behind.
- `down` stops orch's processes on the host (daemon and supervisor). A launched host is then
  terminated (its billing stops when `terminate` returns); an adopted one keeps running. It
  refuses while the host still drives an unfinished job, unless `force`.
- What if the host is gone? `status` says `reachable: false`; `down` ends a launched host
  through its provider all the same and forgets an adopted one only with `force`.
- A launched host that powered itself off (autostop) is asked nothing: `status` shows when its
  billing stopped (`billing_stopped_at`, the spend counted up to then) and `down` forgets it,
  reporting that same time.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import sys
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml

from orchestrator.config import Settings
from orchestrator.errors import ControllerHostError, NodeUnreachable, OrchError
from orchestrator.host import handover, machines
from orchestrator.host import record as records
from orchestrator.host import systemd as systemd_unit
from orchestrator.host.autostop import DEFAULT_DEADMAN_S, unfinished
from orchestrator.host.layout import (
    DEFAULT_ROOT_NAME,
    ROLE,
    HostLayout,
    alive_test,
    env_file_text,
    install_script,
    orch_command,
    parse_target,
    private_dirs,
    start_command,
    stop_command,
    supervisor_script,
)
from orchestrator.host.record import HostRecord
from orchestrator.host.session import HostSession, host_identity
from orchestrator.host.wheel import build_wheel, image_bin_dirs, image_python, image_site_dirs
from orchestrator.node.file_write import PRIVATE, write_file_command
from orchestrator.remote.host_key import scan_host_key
from orchestrator.spec.ids import is_job_id

# Settings that stay on the laptop: where its files are and how its own local nodes are made.
NOT_PASSED_ON = ("ORCH_HOME", "ORCH_LOCAL_NETWORK", "ORCH_LOCAL_ROOT", "ORCH_LOCAL_BRIDGE",
                 "ORCH_LOCAL_SUBNET")  # fmt: skip
DEFAULT_TICK_S = 15.0


def host_environment(environ: Mapping[str, str], local_root: Path | None = None) -> dict[str, str]:
    """The laptop's ORCH_* settings that the host's orch gets too (not the laptop's paths),
    and local nodes of the host's jobs on the host's own loopback. `local_root`: where the
    host's local nodes are kept, when they are to be the laptop's peers (see `launch`); they
    then run this machine's venv too (`local.node_venv`), which outlives the host."""
    passed = {k: v for k, v in environ.items() if k.startswith("ORCH_") and k not in NOT_PASSED_ON}
    shared = (
        {"ORCH_LOCAL_ROOT": str(local_root),
         "ORCH_LOCAL_NODE_VENV": environ.get("ORCH_LOCAL_NODE_VENV", sys.prefix)}
        if local_root is not None
        else {}
    )  # fmt: skip
    return {**passed, **shared, "ORCH_LOCAL_NETWORK": "loopback"}


def _write(session: HostSession, path: str, text: str) -> None:
    """Write `text` into `path` on the host whole, 0600, through stdin (never argv)."""
    session.run(write_file_command(path, PRIVATE), stdin=text)


def adopt(
    settings: Settings,
    target: str,
    *,
    port: int | None,
    identity: str | None,
    autostop_s: float,
    environ: Mapping[str, str],
) -> dict[str, Any]:
    """Make the machine at `target` (`user@addr`) this ORCH_HOME's controller host."""
    where = parse_target(target, port)
    key = scan_host_key(where.host, where.port)
    draft = HostRecord(
        kind="adopted", user=where.user, host=where.host, port=where.port, host_key=key,
        identity=str(Path(identity).resolve()) if identity else str(
            host_identity(settings.home, None).private_key),
        root="", autostop_s=autostop_s, version="", installed_at="",
    )  # fmt: skip
    return install(settings, draft, environ, poweroff=None)


def launch(
    settings: Settings,
    *,
    autostop_s: float,
    environ: Mapping[str, str],
    on_launched: Callable[[HostRecord], None] | None = None,
) -> dict[str, Any]:
    """Launch one local node as the host (owned by no job and no ledger, so no reconcile ever
    takes it for a job's node) and set it up like an adopted one.

    A loopback host and its jobs' nodes are peers on this machine, like machines of one cloud
    account: the host's orch keeps its local nodes where this ORCH_HOME does (`local_root`), so
    they outlive the host and a new host finds them. A namespace host's jobs run on loopback
    inside its network namespace, and end with it.

    `on_launched(record)` runs right after the launch is recorded, before anything is
    installed (the caller opens the host's lease of the bill there). A launch that fails later
    is terminated before this raises."""
    from orchestrator.providers.base import LaunchRequest
    from orchestrator.providers.local.provider import LocalProvider

    identity = host_identity(settings.home, None)
    provider = LocalProvider(settings)
    (node,) = provider.launch(
        LaunchRequest(job_id=ROLE, cluster=ROLE, count=1, gpus_per_node=1,
                      public_key=identity.public_key, spot=False)
    )  # fmt: skip
    draft = HostRecord(
        kind="launched", user=node.ssh_user, host=node.ssh_host, port=node.ssh_port,
        host_key=node.host_key, identity=str(identity.private_key), root="",
        autostop_s=autostop_s, version="", installed_at="", instance_id=node.instance_id,
        provider="local", price_per_hour=str(node.price_per_hour),
        launched_at=node.launched_at.isoformat(),
    )  # fmt: skip
    records.save(settings.home, draft)  # before anything else: `down` can end it from now on
    if on_launched is not None:
        on_launched(draft)
    peers = settings.local_root.resolve() if provider.network_mode() == "loopback" else None
    try:
        return install(settings, draft, environ, poweroff=node.poweroff_command, local_root=peers)
    except BaseException:
        provider.terminate([node.instance_id])
        records.forget(settings.home)
        raise


def _laptop_config(home: Path) -> dict[str, Any]:
    """This ORCH_HOME's config.yaml as a mapping ({} without one; `load_settings` has read it
    already, so it is valid)."""
    path = home / "config.yaml"
    raw = yaml.safe_load(path.read_text()) if path.exists() else None
    return dict(raw) if isinstance(raw, dict) else {}


def host_config(laptop: Mapping[str, Any], owner: str) -> dict[str, Any]:
    """The host's config.yaml: this ORCH_HOME's settings (a team ledger's url among them),
    with `aws.owner` set to `owner`, who submits from here (`Settings.owner_label`: `aws.owner`,
    else this machine's login name), so that the host's jobs and nodes carry the laptop's
    owner, never the host's login user. Pure."""
    aws = laptop.get("aws")
    return {**laptop, "aws": {**(aws if isinstance(aws, dict) else {}), "owner": owner}}


def install(
    settings: Settings,
    draft: HostRecord,
    environ: Mapping[str, str],
    *,
    poweroff: str | None,
    local_root: Path | None = None,
    passed: Mapping[str, str] | None = None,
    systemd: bool = False,
) -> dict[str, Any]:
    """Install this orch on the host of `draft` and start its daemon; returns its status
    document. `passed`: the host's settings (default: `host_environment` of `environ`).
    `systemd`: run the daemon as a systemd unit where the host was booted with systemd (the
    shell supervisor elsewhere)."""
    wheel = build_wheel(records.host_dir(settings.home) / "wheels")
    session = HostSession(settings.home, draft)
    try:
        login_home = session.run("echo $HOME").stdout.strip()
        layout = HostLayout(f"{login_home}/{DEFAULT_ROOT_NAME}")
        session.run(private_dirs([layout.path("wheels")]))  # the root too: 0700 from creation
        session.push(wheel, layout.path(f"wheels/{wheel.name}"))
        script = install_script(
            layout, image_python(), image_site_dirs(), wheel.name, image_bin_dirs()
        )
        version = session.run(script).stdout.strip().splitlines()[-1]
        if passed is None:
            passed = host_environment(environ, local_root)
        environment = env_file_text(layout, passed, image_bin_dirs())
        _write(session, layout.env, environment)
        _write(session, layout.path("supervise.sh"), supervisor_script(layout))
        daemon = {
            "autostop_s": draft.autostop_s,
            "tick_s": float(environ.get("ORCH_HOST_TICK", DEFAULT_TICK_S)),
            "deadman_s": float(environ.get("ORCH_HOST_DEADMAN", DEFAULT_DEADMAN_S)),
            "poweroff": poweroff,
            "version": version,
        }
        _write(session, layout.path("daemon.json"), json.dumps(daemon) + "\n")
        config = host_config(_laptop_config(settings.home), settings.owner_label)
        _write(session, f"{layout.home}/config.yaml", yaml.safe_dump(config, sort_keys=False))
        session.run(f"rm -f {shlex.quote(layout.state)}")  # a heartbeat of this daemon only
        record = dataclasses.replace(
            draft, root=layout.root, version=version, installed_at=datetime.now(UTC).isoformat()
        )
        records.save(settings.home, record)  # intent first: written before the daemon starts
        if systemd and session.run(systemd_unit.DETECT).stdout.strip() == "systemd":
            session.run(
                systemd_unit.install_command(layout),
                stdin=systemd_unit.unit_text(layout, draft.user),
            )
        else:
            session.run(start_command(layout))
        _wait_heartbeat(session, layout)
        return status_document(settings, record, session)
    finally:
        session.close()


def restart(settings: Settings, record: HostRecord) -> dict[str, Any]:
    """Start orch's daemon again on the live host of `record`, whose supervisor and daemon
    ended (killed, the machine restarted, or an adopted host's autostop). Its first tick gives
    a new controller to every unfinished job whose controller ended with them. Returns the
    host's status document."""
    session = HostSession(settings.home, record)
    layout = HostLayout(record.root)
    try:
        session.run(f"rm -f {shlex.quote(layout.state)}; {start_command(layout)}")
        _wait_heartbeat(session, layout)
        return status_document(settings, record, session)
    finally:
        session.close()


def _wait_heartbeat(session: HostSession, layout: HostLayout, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if session.run(f"test -s {shlex.quote(layout.state)}", check=False).ok:
            return
        time.sleep(0.5)
    log = session.run(f"tail -n 20 {shlex.quote(layout.log)}", check=False).stdout
    raise ControllerHostError(
        f"the controller-host daemon wrote no heartbeat within {timeout:.0f} s:\n{log}",
        hint="`orch controller logs` shows its log; `orch controller down` undoes `up`",
    )


def spend(record: HostRecord, until: datetime) -> Decimal | None:
    """What a launched host cost from its launch to `until` (USD, to the micro-dollar); None
    for an adopted host, which orch does not bill."""
    if record.price_per_hour is None or record.launched_at is None:
        return None
    hours = Decimal((until - datetime.fromisoformat(record.launched_at)).total_seconds()) / 3600
    return (Decimal(record.price_per_hour) * hours).quantize(Decimal("0.000001"))


def powered_off_at(settings: Settings, record: HostRecord) -> datetime | None:
    """When a launched host powered its node off by itself (autostop), as its provider keeps
    it: its billing stopped then. None while it runs, after `down`, or for an adopted host."""
    return machines.self_ended_at(settings, record)


def status_document(
    settings: Settings, record: HostRecord, session: HostSession | None = None
) -> dict[str, Any]:
    """What `orch controller status --json` prints: the record, and what the host says now
    (`reachable: false` and no daemon fields when it cannot be reached). A launched host that
    powered itself off is not asked: `billing_stopped_at` says when it went, and `spend_usd`
    counts up to then."""
    now = datetime.now(UTC)
    off_at = powered_off_at(settings, record)
    cost = spend(record, off_at or now)
    document: dict[str, Any] = {
        "host": f"{record.user}@{record.host}:{record.port}",
        "kind": record.kind,
        "instance_id": record.instance_id,
        "price_per_hour": record.price_per_hour,
        "launched_at": record.launched_at,
        "billing_stopped_at": off_at.isoformat() if off_at else None,
        "spend_usd": str(cost) if cost is not None else None,
        "version": record.version,
        "root": record.root,
        "submitted_jobs": record.jobs,
        "reachable": False,
        "running": False,
    }
    if off_at is not None:
        return document
    own = session is None
    session = session or HostSession(settings.home, record)
    layout = HostLayout(record.root)
    try:
        pid = shlex.quote(layout.path("daemon.pid"))
        probe = session.run(
            f"cat {shlex.quote(layout.state)} 2>/dev/null || echo '{{}}'; "
            f"{alive_test(pid)} && echo running || echo stopped",
            check=False,
        )
    except NodeUnreachable as exc:  # its hint sends the user here: this document is the answer
        document["error"] = exc.message
        return document
    except OrchError as exc:
        document["error"] = str(exc)
        return document
    finally:
        if own:
            session.close()
    lines = probe.stdout.strip().splitlines()
    state = json.loads(lines[0]) if lines and lines[0].startswith("{") else {}
    started = state.get("started_at")
    running = bool(lines) and lines[-1] == "running"
    document.update(
        reachable=True,
        running=running,
        pid=state.get("pid") if running else None,
        version=state.get("version") or record.version,
        started_at=started,
        uptime_s=round((now - datetime.fromisoformat(started)).total_seconds(), 1)
        if started and running
        else None,
        heartbeat_at=state.get("heartbeat_at"),
        jobs_seen_at=state.get("jobs_seen_at"),
        jobs=[j for j in _listed(state.get("jobs")) if is_job_id(j)],  # the host's word
        autostop_s=state.get("autostop_s", record.autostop_s),
        autostop_remaining_s=state.get("autostop_remaining_s"),
    )
    return document


def _listed(value: object) -> list[object]:
    return list(value) if isinstance(value, list) else []


def logs(settings: Settings, lines: int) -> str:
    """The last `lines` lines of the daemon's log on the host."""
    record = records.require(settings.home)
    session = HostSession(settings.home, record)
    try:
        log = shlex.quote(HostLayout(record.root).log)
        return session.run(f"tail -n {int(lines)} {log} 2>/dev/null || true").stdout
    finally:
        session.close()


def host_jobs(session: HostSession) -> list[str]:
    """Ids of the host's unfinished jobs (asks its orch); an id that is not of the job-id
    shape is shown as `?` (the host's word is checked before it is printed here)."""
    result = session.run(orch_command(session.layout, ["status", "--json"]))
    return [j if is_job_id(j) else "?" for j in unfinished(json.loads(result.stdout)["jobs"])]


def down(settings: Settings, *, force: bool = False) -> dict[str, Any]:
    """Stop orch on the host and end a launched host; returns what was done."""
    record = records.require(settings.home)
    done: dict[str, Any] = {"host": f"{record.user}@{record.host}:{record.port}",
                            "kind": record.kind, "stopped": False, "terminated": None}  # fmt: skip
    off_at = powered_off_at(settings, record)
    session = HostSession(settings.home, record)
    try:
        if record.root and off_at is None:
            live = host_jobs(session)
            if live and not force:
                raise ControllerHostError(
                    f"the controller host still drives {len(live)} job(s): {', '.join(live)}",
                    hint="`orch cancel JOB` each, or `orch controller down --force`",
                )
            out = session.run(stop_command(HostLayout(record.root)))
            done["stopped"] = out.stdout.strip().endswith("stopped")
    except OrchError as exc:
        if isinstance(exc, ControllerHostError) or (record.kind == "adopted" and not force):
            raise
        done["error"] = str(exc)  # a launched host is ended below whatever its state
    finally:
        session.close()
    if record.kind == "launched" and record.instance_id:
        stopped = machines.terminate(settings, record)
        done["terminated"] = record.instance_id
        done["billing_stopped_at"] = (off_at or stopped).isoformat()
    records.forget(settings.home)
    handover.forget_all(settings.home)
    return done


def laptop_environment() -> dict[str, str]:
    return dict(os.environ)
