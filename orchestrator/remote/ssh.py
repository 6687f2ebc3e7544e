"""One persistent SSH connection per node, with a pinned host key, keepalive and timeouts.

`NodeConnection` does no I/O when built; it connects on first use and keeps the connection
open for every later command (a new connection costs ~0.4 s, a command on an open one ~0.09 s).
`run` waits for a command; `stream` hands over the lines of a long-running one as they come.
Both hold a bounded amount of what the node prints: `run` reads at most `max_output` bytes
(then ends the command and says its result was cut), `stream` cuts lines at `max_line`.
A host presenting any key other than the one its provider reported is refused
(`HostKeyMismatch`); a host that does not answer raises `NodeUnreachable`.

A node with a home of its own (`HostAddress.home`: an allocation on a shared machine) runs
every command with HOME exported to that folder and in it (`node_home.in_home`); a node with a
`proxy_jump` is reached through that host (`node_home.jump_command`).
"""

from __future__ import annotations

import base64
import shlex
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import paramiko
from fabric import Config, Connection

from orchestrator.errors import HostKeyMismatch, NodeUnreachable, OutputTooLarge, RemoteError
from orchestrator.remote.keys import HostAddress, Identity
from orchestrator.remote.lines import DEFAULT_MAX_LINE, scrub
from orchestrator.remote.node_home import in_home, jump_command
from orchestrator.remote.streams import CommandLines

DEFAULT_MAX_OUTPUT = 16 * 1024 * 1024  # bytes of stdout (and of stderr) `run` keeps by default
EOF_GRACE_S = 1.0  # how long `run` waits for a command's EOF once it exited with nothing to read


@dataclass(frozen=True)
class CommandResult:
    """What a remote command did. `stdout` and `stderr` are decoded as UTF-8 (undecodable
    bytes replaced); `stdout_bytes` is stdout as the node sent it.

    `cut`: the command printed more than `run`'s `max_output` on stdout or stderr, so reading
    stopped there and the channel was closed (the command ended with it): each holds only its
    first `max_output` bytes, and `exited` is -1 since no exit status was waited for."""

    command: str
    exited: int
    stdout: str
    stderr: str
    cut: bool = False
    stdout_bytes: bytes = field(default=b"", repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return self.exited == 0

    def tail(self, lines: int = 20, max_chars: int = 4000) -> str:
        """The last `lines` lines of stdout then stderr, and at most their last `max_chars`
        characters, for a message: control characters (but tab and newline) replaced."""
        err = "\n" + self.stderr[-max_chars:] if self.stderr.strip() else ""
        text = (self.stdout[-max_chars:] + err).rstrip()
        return scrub("\n".join(text.splitlines()[-lines:])[-max_chars:])


def shell_command(argv: Sequence[str]) -> str:
    """Quote an argv for the remote shell; user input never reaches it unquoted."""
    return shlex.join(argv)


class NodeConnection:
    """A reusable SSH session to one host. Thread-safe: commands may run from several threads.

    `connect_timeout` bounds the TCP connect and the SSH handshake; `keepalive` is the interval
    of SSH keepalive packets, so a dead peer is noticed by the transport.
    """

    def __init__(
        self,
        address: HostAddress,
        identity: Identity,
        *,
        connect_timeout: float = 10.0,
        command_timeout: float = 120.0,
        keepalive: int = 5,
    ) -> None:
        self.address = address
        self.identity = identity
        self.connect_timeout = connect_timeout
        self.command_timeout = command_timeout
        self.keepalive = keepalive
        self._connection: Connection | None = None
        self._lock = threading.Lock()

    def _open(self) -> Connection:
        with self._lock:
            if self._connection is not None and self._connection.is_connected:
                return self._connection
            if self._connection is not None:
                self._connection.close()
            config = Config(overrides={"load_ssh_configs": False, "run": {"hide": True}})
            connection = Connection(
                host=self.address.host,
                port=self.address.port,
                user=self.address.user,
                config=config,
                forward_agent=False,  # never the user's agent on a node, whatever the config
                gateway=(
                    jump_command(self.address.proxy_jump, int(max(1, self.connect_timeout)))
                    if self.address.proxy_jump
                    else None
                ),
                connect_timeout=int(max(1, self.connect_timeout)),
                connect_kwargs={
                    "key_filename": str(self.identity.private_key),
                    "look_for_keys": False,
                    "allow_agent": False,
                    "banner_timeout": self.connect_timeout,
                    "auth_timeout": self.connect_timeout,
                },
            )
            client = connection.client
            client.set_missing_host_key_policy(paramiko.RejectPolicy())
            key_type, key_data = self.address.host_key.split()[:2]
            client.get_host_keys().add(
                self.address.known_hosts_name,
                key_type,
                paramiko.PKey.from_type_string(key_type, base64.b64decode(key_data)),
            )
            try:
                connection.open()
            except paramiko.BadHostKeyException as exc:
                raise HostKeyMismatch(
                    f"{self.address.name} at {self.address.known_hosts_name} presented a "
                    "different host key than its provider reported; connection refused",
                    hint="the host may have been replaced or intercepted: `orch down` the "
                    "cluster and launch again",
                ) from exc
            except paramiko.SSHException as exc:
                if "not found in known_hosts" in str(exc):
                    raise HostKeyMismatch(
                        f"{self.address.name} presented an unknown host key type; refused"
                    ) from exc
                raise self._unreachable(exc) from exc
            except (OSError, EOFError) as exc:
                raise self._unreachable(exc) from exc
            transport = connection.transport
            if transport is not None:
                transport.set_keepalive(self.keepalive)
            self._connection = connection
            return connection

    def _unreachable(self, exc: BaseException) -> NodeUnreachable:
        return NodeUnreachable(
            f"cannot reach {self.address.name} at {self.address.known_hosts_name}: {exc}",
            hint="the node may be gone or cut off; `orch status` shows the job's nodes",
        )

    @property
    def transport(self) -> paramiko.Transport:
        """The open SSH transport (connecting if needed), for long-lived channels."""
        transport = self._open().transport
        assert transport is not None  # set by Connection.open()
        return transport

    def is_alive(self) -> bool:
        """True when the transport is up (keepalives still answered); never connects."""
        connection = self._connection
        transport = connection.transport if connection is not None else None
        return bool(transport is not None and transport.is_active())

    def run(
        self,
        command: str | Sequence[str],
        *,
        timeout: float | None = None,
        check: bool = True,
        stdin: str | None = None,
        max_output: int = DEFAULT_MAX_OUTPUT,
    ) -> CommandResult:
        """Run `command` (a shell string, or an argv that gets quoted) and wait for it; on a
        node with a home, in it with HOME set to it (the folder made 0700 when missing).

        At most `max_output` bytes of its stdout, and as many of its stderr, are read (16 MiB
        by default; a caller that expects more passes more): past that, reading stops, the
        command is ended and the result is `cut` (see `CommandResult`), so a node printing
        without end costs a bounded buffer and no wait for the timeout.

        Raises `RemoteError` (carrying the result) on a non-zero exit when `check` is true,
        `OutputTooLarge` (a `RemoteError`) for a cut result when `check` is true,
        `NodeUnreachable` when the host cannot be reached or the command outlives `timeout`.
        """
        text = command if isinstance(command, str) else shell_command(command)
        limit = self.command_timeout if timeout is None else timeout
        transport = self.transport
        sent = in_home(text, self.address.home)
        try:
            exited, out, err, cut = _exec(transport, sent, stdin, limit, max_output)
        except TimeoutError as exc:
            raise NodeUnreachable(
                f"{self.address.name}: command did not finish within {limit:.0f} s",
                hint="the node may be overloaded or cut off",
            ) from exc
        except (OSError, EOFError, paramiko.SSHException) as exc:
            self.close()
            raise self._unreachable(exc) from exc
        result = CommandResult(
            text, exited, out.decode(errors="replace"), err.decode(errors="replace"), cut, out
        )
        if check and cut:
            raise OutputTooLarge(
                f"{self.address.name}: the command printed more than {max_output} bytes; "
                "reading stopped there and the command was ended",
                hint="the node printed far more than this command should; look at what it "
                "runs there (`orch ssh`)",
                result=result,
            )
        if check and not result.ok:
            raise RemoteError(
                f"{self.address.name}: command exited {result.exited}:\n{result.tail(10)}",
                result=result,
            )
        return result

    def stream(
        self,
        command: str | Sequence[str],
        *,
        pty: bool = False,
        idle_timeout_s: float | None = None,
        max_line: int = DEFAULT_MAX_LINE,
        open_timeout: float = 10.0,
        stdin: str | None = None,
    ) -> CommandLines:
        """Start `command` (a shell string, or an argv that gets quoted) on a new channel of
        the open connection (connecting if needed) and return its lines as they come; see
        `CommandLines` for the iteration, `close()` and the errors it raises; a line longer
        than `max_line` bytes is cut, so the stream holds a bounded buffer whatever the node
        prints.

        `pty`: ask for a pseudo-terminal (so closing the stream hangs up even a stuck command;
        its stderr then comes with its stdout); a server that refuses one gets a plain channel,
        whose stderr is not read. Raises `NodeUnreachable` when the host cannot be reached or
        the command cannot be started within `open_timeout`. `stdin`, when given, is sent
        whole, then the command's standard input is closed (a password, never an argument).
        """
        text = command if isinstance(command, str) else shell_command(command)
        transport = self.transport
        try:
            channel = transport.open_session(timeout=open_timeout)
            if pty:
                try:
                    channel.get_pty(term="dumb", width=512, height=24)
                except paramiko.SSHException:  # the server refuses ptys: go on without one
                    channel.close()
                    channel = transport.open_session(timeout=open_timeout)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise self._unreachable(exc) from exc
        try:
            channel.exec_command(in_home(text, self.address.home))
            if stdin is not None:
                channel.sendall(stdin.encode())
                channel.shutdown_write()
        except (OSError, EOFError, paramiko.SSHException) as exc:
            channel.close()
            raise self._unreachable(exc) from exc
        return CommandLines(
            channel, name=self.address.name, idle_timeout_s=idle_timeout_s, max_line=max_line
        )

    def abort(self) -> None:
        """Close the open transport at once, from any thread, without waiting for a connect
        in progress: commands waiting on it fail now (`NodeUnreachable`) instead of at the
        keepalive timeout. The next command reconnects."""
        connection = self._connection
        if connection is not None:
            connection.close()

    def close(self) -> None:
        """Close the connection; the next command reconnects."""
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None


def _exec(
    transport: paramiko.Transport,
    command: str,
    stdin: str | None,
    timeout: float,
    max_output: int,
) -> tuple[int, bytes, bytes, bool]:
    """Run one command on a new channel of an open transport: (exit code, stdout, stderr,
    cut).

    stdin, when given, is sent whole and then closed (EOF), so `cat > file` works. Once stdout
    or stderr passes `max_output` bytes, reading stops and the channel is closed (which ends
    the command): each keeps its first `max_output` bytes, `cut` is True and the exit code is
    -1 (unknown). Raises TimeoutError when the command has not finished after `timeout`
    seconds.
    """
    deadline = time.monotonic() + timeout
    channel = transport.open_session(timeout=timeout)
    out, err = _Capped(max_output), _Capped(max_output)
    try:
        channel.settimeout(0.2)
        channel.exec_command(command)
        if stdin is not None:
            channel.sendall(stdin.encode())
        channel.shutdown_write()
        quiet_since: float | None = None  # since when the command exited with nothing to read
        while not (out.full or err.full):
            progressed = False
            if channel.recv_ready():
                out.add(channel.recv(65536))
                progressed = True
            if channel.recv_stderr_ready():
                err.add(channel.recv_stderr(65536))
                progressed = True
            if channel.exit_status_ready() and not (
                channel.recv_ready() or channel.recv_stderr_ready()
            ):
                # sshd may send the exit status before the last of the output: the output is
                # whole at the channel's EOF, which a process the command left running with
                # its stdout open may hold back, so that is waited for a short while only
                now = time.monotonic()
                quiet_since = now if progressed or quiet_since is None else quiet_since
                if channel.eof_received or now - quiet_since > EOF_GRACE_S:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(command)
            if not progressed:
                # Wake on data or exit; `status_event` is set when the exit status arrives.
                channel.status_event.wait(0.01)
        # Data that came with the EOF, between the last look and the EOF's: what is buffered
        # is all of it once the EOF is in.
        while not (out.full or err.full) and (channel.recv_ready() or channel.recv_stderr_ready()):
            if channel.recv_ready():
                out.add(channel.recv(65536))
            if channel.recv_stderr_ready():
                err.add(channel.recv_stderr(65536))
        cut = out.full or err.full
        code = -1 if cut else channel.recv_exit_status()
    finally:
        channel.close()
    return code, out.join(), err.join(), cut


class _Capped:
    """The first `cap` bytes of a stream, kept as the pieces that came (joined once, so the
    bytes are held at most twice); `full` once more than `cap` came."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.size = 0
        self.full = False
        self._pieces: list[bytes] = []

    def add(self, piece: bytes) -> None:
        room = self.cap - self.size
        if len(piece) > room:
            piece, self.full = piece[:room], True
        self._pieces.append(piece)
        self.size += len(piece)

    def join(self) -> bytes:
        data, self._pieces = b"".join(self._pieces), []
        return data
