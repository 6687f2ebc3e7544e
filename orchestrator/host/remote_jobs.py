"""Jobs that live on the controller host: submit them there, and ask the host about them.

`submit` sends the spec (no secret's value in it), its workdir and data sources (rsync, under
`submissions/<token>/` on the host, 0700), and runs `orch submit --detach` there in one command
whose stdin carries the secrets into that orch's environment (`submission.submit_command`). The
job id the host prints is checked against the job-id shape before it names anything here. The
job's ledger, controller and logs are the host's; this ORCH_HOME remembers the job's id
(host.json's `jobs`) and keeps its hand-over kit (`handover`), so that a new host can take the
job over if this one dies. `ask` runs an `orch` command there for such a job (the live view of
`orch status --watch`) and returns what it printed and its exit status; the job commands' typed
requests go through `control.verbs.host_jobs`.
"""

from __future__ import annotations

import dataclasses
import json
import secrets as tokens
import shlex
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml

from orchestrator.config import Settings
from orchestrator.errors import ControllerHostError, SpecError
from orchestrator.host import handover
from orchestrator.host import record as records
from orchestrator.host.layout import HostLayout, free_port_command, orch_command, private_dirs
from orchestrator.host.record import checked_job_id
from orchestrator.host.session import HostSession, host_identity
from orchestrator.host.submission import (
    host_spec,
    inline_secrets,
    is_bucket_item,
    secrets_text,
    spec_secrets,
    split_args,
    submit_command,
)
from orchestrator.remote.keys import HostAddress, write_known_hosts
from orchestrator.remote.shell import Forward, parse_forward, shell_argv
from orchestrator.remote.ssh import CommandResult


def submit(
    settings: Settings, argv: Sequence[str], spec_index: int, environ: Mapping[str, str]
) -> tuple[str, CommandResult]:
    """Submit the job of `argv` (the arguments after `submit`) on the host; returns its id
    and the host's output."""
    record = records.require(settings.home)
    spec_path = Path(argv[spec_index])
    try:
        spec = yaml.safe_load(spec_path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise SpecError(f"cannot read the job spec {spec_path}: {exc}") from exc
    plan = split_args(argv, spec_index, environ)
    secrets = {**inline_secrets(spec, environ), **spec_secrets(spec, environ), **plan.secrets}
    base = spec_path.resolve().parent
    session = HostSession(settings.home, record)
    try:
        folder = session.layout.submission(tokens.token_hex(6))
        session.run(private_dirs([f"{folder}/data"]))
        workdir = (base / str(spec.get("workdir", "."))).resolve()
        session.push(workdir, f"{folder}/work", workdir=True)
        data: list[str | None] = []
        for i, item in enumerate(spec.get("data") or []):
            if is_bucket_item(item):  # the nodes download it themselves
                data.append(None)
                continue
            source = Path(str(item["src"])).expanduser()
            source = source if source.is_absolute() else base / source
            session.push(source, f"{folder}/data/{i}")
            data.append(str(source.resolve()))
        with tempfile.TemporaryDirectory(prefix="orch-remote-") as scratch:
            moved = Path(scratch) / "job.yaml"
            moved.write_text(yaml.safe_dump(host_spec(spec, folder), sort_keys=False))
            session.push(moved, f"{folder}/job.yaml")
        result = session.run(
            submit_command(session.layout, folder, plan.args),
            stdin=secrets_text(secrets),
            check=False,
        )
        if not result.ok:
            return "", result
        job_id = job_id_of(result.stdout)
        records.add_job(settings.home, job_id)
        handover.save_submission(
            settings.home, job_id, handover.Submission(folder, str(workdir), data)
        )
        handover.fetch(session, settings.home, job_id)
    finally:
        session.close()
    return job_id, result


def job_id_of(stdout: str) -> str:
    """The job id in what the host's `orch submit` printed (its `--json` document's `id`,
    else its last line), checked against the job-id shape (`record.checked_job_id`): raises
    `ControllerHostError` for anything else. Pure."""
    text = stdout.strip()
    try:
        found: object = json.loads(text)["id"]
    except (ValueError, KeyError, TypeError):
        lines = text.splitlines()
        if not lines:
            raise ControllerHostError("the host's orch submit printed no job id") from None
        found = lines[-1].strip()
    return checked_job_id(found, "its answer to orch submit")


def refresh_kit(settings: Settings, job_id: str) -> bool:
    """Fetch the hand-over kit of `job_id` again when this ORCH_HOME's copy lacks a file (the
    job's controller had not made its key within `handover.KEYS_WAIT_S` of the submit);
    returns whether the kit is complete. Waits for nothing."""
    if handover.complete(settings.home, job_id):
        return True
    session = HostSession(settings.home, records.require(settings.home))
    try:
        return handover.fetch(session, settings.home, job_id, wait_s=0)
    finally:
        session.close()


def stream(
    settings: Settings,
    argv: Sequence[str],
    *,
    tty: bool = False,
    forwards: Sequence[Forward] = (),
) -> int:
    """Run `orch ARGV` on the host with its output passed through as it comes (`logs -f`,
    `wait`, `ssh`), over the OpenSSH client with the record's key and pinned host key; returns
    its exit status (255: ssh itself failed). `tty`: with a terminal, for interactive use;
    `forwards`: this machine's ports forwarded to the host (HOST as the host sees it)."""
    record = records.require(settings.home)
    address = HostAddress("controller host", record.host, record.port, record.user,
                          record.host_key)  # fmt: skip
    identity = host_identity(settings.home, record.identity)
    write_known_hosts(identity.known_hosts, [address])
    command = orch_command(HostLayout(record.root), argv)
    ssh = shell_argv(address, identity, identity.known_hosts, command=["sh", "-c", command],
                     tty=tty, forwards=forwards)  # fmt: skip
    return subprocess.run(ssh, check=False).returncode


def host_free_ports(settings: Settings, count: int) -> list[int]:
    """`count` distinct ports that can be bound on the host now (for tunnels through it)."""
    record = records.require(settings.home)
    session = HostSession(settings.home, record)
    ports: list[int] = []
    try:
        while len(ports) < count:
            port = int(session.run(free_port_command(), timeout=30).stdout.strip())
            if port not in ports:
                ports.append(port)
    finally:
        session.close()
    return ports


def ssh_via_host(settings: Settings, rest: Sequence[str], *, interactive: bool) -> int:
    """`orch ssh JOB [--node N] [-L ...] [-- COMMAND]` (`rest`) of a job on the host: the
    host's own `orch ssh` (it holds the job's key), over a terminal when `interactive` and no
    command is given; returns its exit status. COMMAND's words reach the host's `orch ssh` as
    they are, which joins them for the node's shell as ssh does. Each `-L` becomes two hops
    (`two_hop_forwards`)."""
    split = list(rest).index("--") if "--" in rest else len(rest)
    head, command = list(rest[:split]), list(rest[split:])
    texts: list[str] = []
    kept: list[str] = []
    i = 0
    while i < len(head):
        if head[i] == "-L" and i + 1 < len(head):
            texts.append(head[i + 1])
            i += 1
        elif head[i].startswith("-L") and len(head[i]) > 2:
            texts.append(head[i][2:])
        else:
            kept.append(head[i])
        i += 1
    forwards = [parse_forward(text) for text in texts]
    ports = host_free_ports(settings, len(forwards)) if forwards else []
    here, there = two_hop_forwards(forwards, ports)
    tty = interactive and not command[1:]  # command: "--" and its words
    return stream(settings, ["ssh", *kept, *there, *command], tty=tty, forwards=here)


def two_hop_forwards(
    forwards: Sequence[Forward], host_ports: Sequence[int]
) -> tuple[list[Forward], list[str]]:
    """`-L` forwards meant for a node of a job on the host, as two hops: this machine's port
    to a free port of the host (each of `host_ports`), and the host's `orch ssh -L` from there
    to HOST:REMOTE as the node sees it (so `localhost` is still the node itself). Returns this
    machine's forwards and the `-L` arguments for the host's `orch ssh`. Pure."""
    here = [
        dataclasses.replace(f, host="127.0.0.1", remote_port=port)
        for f, port in zip(forwards, host_ports, strict=True)
    ]
    there: list[str] = []
    for f, port in zip(forwards, host_ports, strict=True):
        there += ["-L", f"{port}:{f.host}:{f.remote_port}"]
    return here, there


def fetch_report(settings: Settings, argv: Sequence[str], out: Path) -> CommandResult:
    """`orch report ARGV` drawn on the host (its ledger holds the job), the file it wrote
    copied to `out` here; the host's copy is removed. Returns the host's answer."""
    record = records.require(settings.home)
    session = HostSession(settings.home, record)
    remote = f"/tmp/orch-report-{tokens.token_hex(8)}{out.suffix or '.png'}"
    try:
        result = session.run(orch_command(session.layout, [*argv, "--out", remote]),
                             check=False, timeout=300)  # fmt: skip
        if result.ok:
            session.pull(remote, out)
        return result
    finally:
        session.run(f"rm -f {shlex.quote(remote)}", check=False)
        session.close()


def ask(settings: Settings, argv: Sequence[str], *, timeout: float = 300) -> CommandResult:
    """Run `orch ARGV` on the host (its environment, its ORCH_HOME); never raises for the
    command's own exit status. The answer is read up to `NodeConnection.run`'s cap: a longer
    one comes back `cut`, with a line on its stderr saying so."""
    record = records.require(settings.home)
    session = HostSession(settings.home, record)
    try:
        result = session.run(orch_command(session.layout, argv), check=False, timeout=timeout)
    finally:
        session.close()
    if not result.cut:
        return result
    note = (f"\nthe controller host's answer to `orch {shlex.join(argv)}` was longer than orch "
            "reads of a host's answer, and was cut\n")  # fmt: skip
    return dataclasses.replace(result, stderr=result.stderr + note)
