"""The controller-host daemon: `python -m orchestrator.host.daemon --root DIR`, run on the host
by its supervisor (`layout.supervisor_script`), which starts it again if it dies.

Every `tick_s` it asks the host's orch for its jobs (`orch status --json`, which also gives a
new controller to any unfinished job whose controller died) and writes its heartbeat to
`state.json`. Its jobs are those whose record is in the host's ORCH_HOME (`own`); while `up`
hands a dead host's jobs over (`handing_over`) it counts as busy too. Of its jobs that ended it
removes the secrets file and the submission folder (`leftovers`). Once it has driven no
unfinished job for `autostop_s` it stops: it sets the stop flag (so the supervisor
does not restart it), runs the host's poweroff command when the host was launched by orch
(billing stops when the machine is gone), and exits 0. SIGTERM (from
`orch controller down`) ends it at once with exit 0.

While `orch status` fails there, the dead-man rule (`autostop`) bounds how long the jobs it
last saw keep it up: `deadman_s`, counted from its last look that worked, which `state.json`
keeps (`jobs_seen_at`), so a daemon that its supervisor starts again counts on from there.
Everything it and its children make is private to the login user (umask 077).

Its settings are in `DIR/daemon.json`, written by `orch controller up`:
`{"autostop_s": 600, "tick_s": 15, "deadman_s": 3600, "poweroff": null | "command",
"version": "0.1.0"}`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from orchestrator.atomic import write_atomic
from orchestrator.host import leftovers
from orchestrator.host.autostop import DEFAULT_DEADMAN_S, IdleClock, finished, unfinished
from orchestrator.host.layout import HostLayout

HANDOVER_MAX_S = 1800.0  # a hand-over flag older than this is one that died half-way


def _write_json(path: Path, document: dict[str, Any]) -> None:
    write_atomic(path, json.dumps(document) + "\n")


def _jobs(layout: HostLayout) -> list[dict[str, Any]] | None:
    """The host's jobs as `orch status --json` lists them; None when it could not say."""
    try:
        done = subprocess.run(
            [layout.orch, "status", "--json"],
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
        return list(json.loads(done.stdout)["jobs"]) if done.returncode == 0 else None
    except (OSError, ValueError, KeyError, subprocess.TimeoutExpired):
        return None


def own(job_ids: list[str], home: Path) -> list[str]:
    """Those of `job_ids` this host drives: their record is in its ORCH_HOME (`home`). On a
    team ledger the host's orch lists every machine's jobs; a teammate's unfinished job must
    not keep the host from its autostop."""
    return [job_id for job_id in job_ids if (home / "jobs" / job_id / "job.json").is_file()]


def handing_over(flag: Path, now: float) -> bool:
    """Whether a hand-over of a dead host's jobs is under way (`HostLayout.handover_flag`,
    touched less than `HANDOVER_MAX_S` ago: one that died half-way keeps the host up no
    longer)."""
    try:
        return now - flag.stat().st_mtime < HANDOVER_MAX_S
    except OSError:
        return False


def _log(message: str) -> None:
    sys.stdout.write(f"{datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ} {message}\n")
    sys.stdout.flush()


def last_seen(state: Path, default: float) -> float:
    """When a look at the jobs last worked, as the daemon's previous heartbeat (`state`) says;
    `default` when it says nothing (no file, or no such time in it)."""
    try:
        seen = json.loads(state.read_text()).get("jobs_seen_at")
        return datetime.fromisoformat(seen).timestamp() if seen else default
    except (OSError, ValueError, TypeError, AttributeError):
        return default


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat()


def run(root: Path) -> int:
    """The daemon's loop (see the module docstring); returns its exit status."""
    os.umask(0o077)
    layout = HostLayout(str(root))
    config = json.loads((root / "daemon.json").read_text())
    tick_s = float(config.get("tick_s", 15))
    started = datetime.now(UTC)
    clock = IdleClock(
        float(config.get("autostop_s", 600)),
        None,
        seen_at=last_seen(Path(layout.state), started.timestamp()),
        deadman_s=float(config.get("deadman_s", DEFAULT_DEADMAN_S)),
    )
    (root / "daemon.pid").write_text(f"{os.getpid()}\n")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    _log(f"controller-host daemon {config.get('version')} started (pid {os.getpid()})")
    known: list[str] = []
    cleared: set[str] = set()
    failing = False
    while True:
        jobs = _jobs(layout)
        now = time.time()
        if jobs is not None:
            home = Path(layout.home)
            known = own(unfinished(jobs), home)
            clock = clock.tick(now, len(known) + handing_over(Path(layout.handover_flag), now))
            ended = [j for j in own(finished(jobs), home) if j not in cleared]
            for path in leftovers.clear_ended(layout, ended):
                _log(f"removed {path}: its job ended")
            cleared.update(ended)
            if not handing_over(Path(layout.handover_flag), now):
                for path in leftovers.clear_orphans(layout, known, now):
                    _log(f"removed {path}: no job took it")
            if failing:
                _log("orch status answers again")
            failing = False
        else:
            if not failing:
                _log("orch status failed: the jobs last seen keep the host up for at most "
                     f"{clock.deadman_s:g} s after {_iso(clock.seen_at)}")  # fmt: skip
            failing = True
            clock = clock.blind(now)
        remaining = clock.remaining(now)
        stopping = clock.should_stop(now)
        _write_json(
            Path(layout.state),
            {
                "pid": os.getpid(),
                "version": config.get("version"),
                "started_at": started.isoformat(),
                "heartbeat_at": datetime.now(UTC).isoformat(),
                "jobs": known,
                "jobs_seen_at": _iso(clock.seen_at),
                "autostop_s": clock.autostop_s,
                "autostop_remaining_s": remaining,
                "stopping": stopping,
            },
        )
        if stopping:
            why = (f"orch status failing since {_iso(clock.seen_at)} (dead-man "
                   f"{clock.deadman_s:g} s), then " if failing else "")  # fmt: skip
            _log(f"{why}no job to drive for {clock.autostop_s:g} s: stopping")
            Path(layout.stop_flag).touch()
            if poweroff := config.get("poweroff"):
                _log("powering the host off")
                subprocess.run(["sh", "-c", poweroff], stdin=subprocess.DEVNULL, check=False)
            return 0
        time.sleep(tick_s)


def main() -> None:
    parser = argparse.ArgumentParser(prog="orchestrator.host.daemon")
    parser.add_argument("--root", required=True, type=Path)
    sys.exit(run(parser.parse_args().root))


if __name__ == "__main__":
    main()
