"""One SSH session to the controller host: commands, stdin, and file pushes (rsync).

Builds on remote/: the host key is the pinned one of the record, the key is the record's, no
agent is forwarded. A host that does not answer raises `NodeUnreachable`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from orchestrator.errors import NodeUnreachable
from orchestrator.host.layout import HostLayout
from orchestrator.host.record import HostRecord, host_dir
from orchestrator.remote.keys import HostAddress, Identity, ensure_identity, write_known_hosts
from orchestrator.remote.ssh import DEFAULT_MAX_OUTPUT, CommandResult, NodeConnection
from orchestrator.remote.sync import pull_file_argv, push_argv, run_rsync

HOST_UNREACHABLE_HINT = (
    "the host may have ended itself at its autostop, or be cut off: `orch controller status` "
    "says which (a host that has ended is replaced by `orch controller up`, which takes its "
    "jobs over)"
)


def host_identity(home: Path, key_file: str | None) -> Identity:
    """The key orch logs in to the host with: `key_file` when given, else a key of this
    ORCH_HOME (ORCH_HOME/controller-host/key, made once) whose public half the host must
    authorize. The known_hosts file is always this ORCH_HOME's."""
    identity = ensure_identity(host_dir(home) / "key", "orch-controller-host")
    if key_file is None:
        return identity
    public = Path(f"{key_file}.pub")
    return dataclasses.replace(
        identity,
        private_key=Path(key_file).resolve(),
        public_key=public.read_text().strip() if public.exists() else "",
    )


class HostSession:
    """Commands and pushes to the host of `record`; connects on first use. Close it."""

    def __init__(self, home: Path, record: HostRecord) -> None:
        self.record = record
        self.layout = HostLayout(record.root)
        self.address = HostAddress(
            "controller host", record.host, record.port, record.user, record.host_key
        )
        self.identity = host_identity(home, record.identity)
        write_known_hosts(self.identity.known_hosts, [self.address])
        self.connection = NodeConnection(self.address, self.identity, command_timeout=300)

    def run(
        self,
        command: str,
        *,
        check: bool = True,
        stdin: str | None = None,
        timeout: float = 300,
        max_output: int = DEFAULT_MAX_OUTPUT,
    ) -> CommandResult:
        """`NodeConnection.run` on the host: at most `max_output` bytes of its output read. A
        host that cannot be reached (or went away mid-command) raises `NodeUnreachable` saying
        how to find out why: it may have ended itself at its autostop."""
        try:
            return self.connection.run(
                command, check=check, stdin=stdin, timeout=timeout, max_output=max_output
            )
        except NodeUnreachable as exc:
            if self.connection.is_alive():  # reached, but the command outlasted its timeout
                raise
            raise NodeUnreachable(exc.message, hint=HOST_UNREACHABLE_HINT) from exc

    def push(self, local: Path, destination: str, *, workdir: bool = False) -> None:
        """rsync `local` (a file, or a folder's contents) to `destination` on the host, for
        the login user alone: no group or other permission bit arrives (`--chmod=go=`; the
        owner's, executable bits included, are kept)."""
        argv = push_argv(local, self.address, self.identity, destination, workdir=workdir)
        argv[-2:-2] = ["--chmod=go="]  # an option before the source and destination
        run_rsync(argv, what=f"pushing {local} to the controller host", timeout=600)

    def pull(self, remote_file: str, local: Path) -> None:
        """rsync one file of the host to `local` (its folder is made)."""
        argv = pull_file_argv(self.address, self.identity, remote_file, local)
        run_rsync(argv, what=f"fetching {remote_file} from the controller host", timeout=600)

    def close(self) -> None:
        self.connection.close()
