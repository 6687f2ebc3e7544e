"""File transfer with rsync over ssh: argv builders (pure) and a parallel fan-out.

Transfers use the cluster's key and pinned known_hosts; a changed host key fails the transfer.
Remote paths given as `~/x` or relative are relative to the node's home directory: the login's,
or the node's own home on a shared machine (`HostAddress.home`), where the node's rsync runs
with HOME set to it (`node_home.rsync_path`).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from orchestrator.errors import (
    ConfigError,
    HostKeyMismatch,
    NodeUnreachable,
    RemoteError,
    TransferTimeout,
)
from orchestrator.remote.keys import HostAddress, Identity
from orchestrator.remote.node_home import jump_options, rsync_path

# Per-directory filter files honoured when syncing a workdir: git's ignores and orch's own.
WORKDIR_FILTERS = (
    "--exclude=/.git",
    "--filter=:- .gitignore",
    "--filter=:- .orchignore",
)


def literal_pattern(name: str) -> str:
    """`name` as an rsync filter pattern that matches it and nothing else. rsync reads a
    backslash as an escape only in a pattern that holds a wildcard (`*`, `?`, `[`): so a name
    without one is its own pattern, and in one with them every wildcard and backslash is
    escaped."""
    if not any(char in name for char in "*?["):
        return name
    return "".join(f"\\{char}" if char in "\\*?[" else char for char in name)


FAST_CIPHERS = "aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com"
"""ssh's ciphers for transfers where this CPU has AES instructions: AES-GCM first (two to three
times ChaCha20's throughput there, and rsync over ssh is bound by it), ssh's default after."""


LOW_PRIORITY_NICE = 10  # `nice` of a low-priority copy, at both ends


def cipher_option(cpu_flags: str | None) -> list[str]:
    """`-o Ciphers=...` preferring AES-GCM when `cpu_flags` (the `flags` line of
    /proc/cpuinfo) has `aes`; nothing (ssh's own order) otherwise or when unknown."""
    if cpu_flags is None or "aes" not in cpu_flags.split():
        return []
    return ["-o", f"Ciphers={FAST_CIPHERS}"]


@functools.cache
def _cpu_flags() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line.split(":", 1)[1]
    except OSError:
        pass
    return None


UNTRUSTED_HOST_OPTIONS = (
    "-o", "ForwardAgent=no",
    "-o", "ForwardX11=no",
    "-o", "ClearAllForwardings=yes",
    "-o", "PermitLocalCommand=no",
)  # fmt: skip
"""ssh options for a connection to a node: no agent or X11 forwarding, no port forwardings
from any configuration, no `LocalCommand`. (An `orch ssh -L` would have to leave out
`ClearAllForwardings`, which also clears forwardings given on the command line.)"""


def ssh_transport_argv(
    address: HostAddress, identity: Identity, connect_timeout: int, *, multiplex: bool = True
) -> list[str]:
    """The `ssh` invocation rsync uses: batch mode, pinned host key, the cluster's key only,
    AES-GCM first where this CPU has AES instructions (`cipher_option`).

    No configuration file is read (`-F /dev/null`: neither ~/.ssh/config nor the system's), and
    nothing is forwarded or run locally whatever ssh's defaults (`UNTRUSTED_HOST_OPTIONS`): a
    cloud node must never get the user's agent, and a `LocalCommand` or `ProxyCommand` meant
    for the user's own hosts must never run for one.

    With `multiplex`, transfers to a node share one ssh connection that stays up for a minute
    after the last use, so checkpoint and log pulls skip the handshake (~0.3 s each).
    A node with a `proxy_jump` is reached through it (`-J`, `node_home.jump_options`).
    """
    argv = [
        "ssh",
        "-F", "/dev/null",
        *UNTRUSTED_HOST_OPTIONS,
        "-o", f"IdentityFile={ssh_option_path(identity.private_key)}",
        "-p", str(address.port),
        "-o", "BatchMode=yes",
        "-o", "IdentitiesOnly=yes",
        "-o", "StrictHostKeyChecking=yes",
        "-o", f"UserKnownHostsFile={ssh_option_path(identity.known_hosts)}",
        "-o", "GlobalKnownHostsFile=/dev/null",
        "-o", f"ConnectTimeout={connect_timeout}",
        "-o", "ServerAliveInterval=5",
        "-o", "LogLevel=ERROR",
        *cipher_option(_cpu_flags()),
        *jump_options(address.proxy_jump),
    ]  # fmt: skip
    if multiplex:
        # The host key in the socket's name: a node replaced at the same address (a spot
        # recovery) must not be reached through the master of the node it replaced.
        node = hashlib.sha256(address.host_key.encode()).hexdigest()[:8]
        argv += [
            "-o", "ControlMaster=auto",
            "-o", f"ControlPath={ssh_option_path(identity.control_dir, f'/{node}-%C')}",
            "-o", "ControlPersist=60",
        ]  # fmt: skip
    return argv


def ssh_path_token(path: Path | str) -> str:
    """A file path as ssh reads it in `-i` and path options: `%` escaped (ssh expands `%x`).

    ssh also expands `${NAME}` there and has no escape for it; such a path is refused.
    """
    text = str(path)
    if "${" in text:
        raise ConfigError(
            f"path {text!r} contains '${{', which ssh would expand",
            hint="choose an ORCH_HOME without '${'",
        )
    return text.replace("%", "%%")


def ssh_option_path(path: Path | str, suffix: str = "") -> str:
    """A path as the value of an `ssh -o` option: escaped and double-quoted, so spaces and
    quotes in ORCH_HOME survive ssh's own splitting of option values. `suffix` is appended
    as is (for ssh's `%C` token)."""
    token = ssh_path_token(path).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{token}{suffix}"'


def remote_path(path: str) -> str:
    """A node path as rsync should see it: `~/x` and relative paths live under the home."""
    if path in ("~", "~/"):
        return "."
    if path.startswith("~/"):
        return path[2:] or "."
    return path


PULL_OPTIONS = (
    "--recursive",
    "--times",
    "--no-links",
    "--no-perms",
    "--no-owner",
    "--no-group",
    "--no-devices",
    "--no-specials",
    "--chmod=D0700,F0600",
)
"""How rsync copies from a node (or a controller host), which are not trusted, into
ORCH_HOME: regular files and folders only, owned by whoever runs orch, 0600 and 0700. A
symlink, a device, a FIFO or a socket on the node does not arrive at all, and neither do its
owners or its setuid, setgid and sticky bits (`-a`, run as root, would keep them all)."""


def rsync_argv(
    sources: Sequence[str],
    destination: str,
    *,
    transport: Sequence[str],
    delete: bool = False,
    extra: Sequence[str] = (),
    modes: Sequence[str] = ("-a",),
) -> list[str]:
    """argv for one rsync run. `sources`/`destination` are rsync paths (`host:path` remote);
    `modes` says what of each file is copied (`-a`: everything; pulls: `PULL_OPTIONS`)."""
    # --protect-args: file names travel inside rsync's protocol, never through the node's
    # shell, whatever the local rsync's default (older ones pass them to the remote shell).
    argv = ["rsync", *modes, "--partial", "--protect-args", "-e", shlex.join(transport)]
    if delete:
        argv.append("--delete")
    argv.extend(extra)
    argv.extend(sources)
    argv.append(destination)
    return argv


def push_argv(
    local: Path,
    address: HostAddress,
    identity: Identity,
    destination: str,
    *,
    connect_timeout: int = 10,
    workdir: bool = False,
    protect: Sequence[str] = (),
    leave_out: Sequence[str] = (),
    low_priority: bool = False,
    extra: Sequence[str] = (),
) -> list[str]:
    """rsync argv pushing a local file or directory (its contents) to `destination` on a node.

    With `workdir`, `.gitignore`/`.orchignore` are honoured and `.git` is left out; files
    removed locally are removed on the node so the node holds exactly the synced tree, except
    under the directories of `protect` (relative to `local`: a checkpoint directory inside the
    workdir, whose files the node keeps). The files of `leave_out` (relative to `local`: those
    `orch submit --fresh` leaves out) are neither sent nor removed where a node has them.
    `low_priority` runs both ends under `nice`: a copy made beside more urgent work (a spot
    notice's emergency checkpoint) gives way to it. `extra`: more rsync options.
    """
    source = f"{local}/" if local.is_dir() else str(local)
    target = remote_path(destination)
    if local.is_dir():
        target = target.rstrip("/") + "/"
    mkpath = ["--mkpath"]
    niced = ["nice", "-n", str(LOW_PRIORITY_NICE)] if low_priority else []
    return niced + rsync_argv(
        [source],
        f"{address.user}@{_host(address)}:{target}",
        transport=ssh_transport_argv(address, identity, connect_timeout),
        delete=workdir,
        extra=[
            *mkpath,
            *(f"--exclude=/{literal_pattern(path)}" for path in leave_out),
            *(f"--filter=P /{path.strip('/')}/***" for path in protect),
            *(WORKDIR_FILTERS if workdir else ()),
            *_rsync_path(address, LOW_PRIORITY_NICE if low_priority else None),
            *extra,
        ],
    )


def pull_argv(
    address: HostAddress,
    identity: Identity,
    remote_dir: str,
    local: Path,
    *,
    files_from: Path | None = None,
    connect_timeout: int = 10,
) -> list[str]:
    """rsync argv pulling `remote_dir` (or just the files listed, each ended by NUL, in the
    local file `files_from`) from a node into `local`: its regular files only (`PULL_OPTIONS`)."""
    extra = ["--mkpath", *_rsync_path(address)]
    if files_from is not None:
        extra += [f"--files-from={files_from}", "--from0"]
    source = remote_path(remote_dir).rstrip("/") + "/"
    return rsync_argv(
        [f"{address.user}@{_host(address)}:{source}"],
        f"{local}/",
        transport=ssh_transport_argv(address, identity, connect_timeout),
        extra=extra,
        modes=PULL_OPTIONS,
    )


def pull_file_argv(
    address: HostAddress,
    identity: Identity,
    remote_file: str,
    local_file: Path,
    *,
    connect_timeout: int = 10,
) -> list[str]:
    """rsync argv copying one remote file to `local_file` (its directory is created), as a
    plain file of ours (`PULL_OPTIONS`)."""
    return rsync_argv(
        [f"{address.user}@{_host(address)}:{remote_path(remote_file)}"],
        str(local_file),
        transport=ssh_transport_argv(address, identity, connect_timeout),
        extra=["--mkpath", *_rsync_path(address)],
        modes=PULL_OPTIONS,
    )


def _rsync_path(address: HostAddress, nice: int | None = None) -> list[str]:
    """`--rsync-path` for the node's rsync: in the node's own home, under `nice`; none when
    neither applies."""
    value = rsync_path(address.home, nice=nice)
    return [] if value is None else [f"--rsync-path={value}"]


def _host(address: HostAddress) -> str:
    return f"[{address.host}]" if ":" in address.host else address.host


SSH_FAILED = 255
"""rsync's exit code when it saw its ssh transport exit with an error: the node could not be
reached, or the connection dropped mid-transfer (ssh's keepalive gave up on a node that went
away)."""

STREAM_BROKEN = 12
"""rsync's exit code when its connection closed under it. rsync 3.5 gives it instead of 255 for
the same ssh failure when it notices the closed pipe before it has reaped its ssh: which of the
two a refused connection or a node killed mid-transfer comes out as is a race."""


def ssh_transport_failed(returncode: int, said: str) -> bool:
    """Whether an rsync that exited `returncode`, having written `said`, failed because its ssh
    could not reach the node or lost it: exit 255 always; exit 12 when rsync says its connection
    closed or its pipe broke, or ssh says it could not connect, unless the node's shell said rsync
    is missing there (a node to fix, not a gone one).

    A multiplexed ssh that loses its node may say nothing at all, so an exit 12 cannot wait for
    ssh's own words."""
    if returncode == SSH_FAILED:
        return True
    return (
        returncode == STREAM_BROKEN
        and any(sign in said for sign in _TRANSPORT_GONE)
        and "command not found" not in said
    )


_TRANSPORT_GONE = (
    "connection unexpectedly closed",  # rsync read from a closed pipe
    "Broken pipe",  # rsync wrote to one first (a refused ssh that closed its pipes early)
    "ssh: connect to host",  # ssh's own word that it never reached the node
)


ABORT_POLL_S = 0.2  # how often a transfer that may be aborted looks at its abort flag


def _start(argv: Sequence[str], *, text: bool, own_session: bool) -> subprocess.Popen:
    """Start rsync with its output piped (in a session of its own: its ssh dies with it)."""
    try:
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=text,
            start_new_session=own_session,
        )
    except FileNotFoundError as exc:
        raise RemoteError(
            "rsync is not installed on this machine", hint="install it (apt-get install rsync)"
        ) from exc


def run_rsync(
    argv: Sequence[str],
    *,
    what: str,
    timeout: float | None = None,
    ok_codes: Collection[int] = (0,),
    abort: threading.Event | None = None,
    timeout_hint: str | None = None,
) -> None:
    """Run one rsync; an exit code not in `ok_codes` raises RemoteError with rsync's own
    message: HostKeyMismatch when the node's host key is not the pinned one, NodeUnreachable
    when ssh could not reach the node or lost it mid-transfer. One still running after
    `timeout` seconds is killed with its ssh, and TransferTimeout (with `timeout_hint`) raised.

    `abort`: once set (before or during the transfer), rsync and its ssh are killed within
    `ABORT_POLL_S` and NodeUnreachable raised: for a caller that found the node gone and
    would otherwise wait for ssh's keepalive to give up (15 s). Such a transfer runs in a
    session of its own, so that its ssh can be killed with it."""
    if abort is not None and abort.is_set():
        raise NodeUnreachable(f"{what}: not started: the node was found gone")
    proc = _start(argv, text=True, own_session=abort is not None or timeout is not None)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        wait_s = None if deadline is None else max(0.0, deadline - time.monotonic())
        if abort is not None:
            wait_s = ABORT_POLL_S if wait_s is None else min(wait_s, ABORT_POLL_S)
        try:
            stdout, stderr = proc.communicate(timeout=wait_s)
            break
        except subprocess.TimeoutExpired:
            if abort is not None and abort.is_set():
                _kill(proc, own_session=True)
                raise NodeUnreachable(f"{what}: cut short: the node was found gone") from None
            if deadline is not None and time.monotonic() >= deadline:
                _kill(proc, own_session=True)
                raise TransferTimeout(
                    f"{what}: did not finish within {timeout:g} s; the transfer was stopped",
                    hint=timeout_hint,
                ) from None
    if proc.returncode not in ok_codes:
        raise rsync_failure(what, proc.returncode, stderr or stdout)


PROGRESS_OPTIONS = ("--info=progress2", "--no-inc-recursive")
"""rsync prints the bytes done of the whole run (`progress_bytes` reads them), the total known
from the start."""

_PROGRESS_RE = re.compile(r"^\s*([\d,.]+)\s+\d+%")


def progress_bytes(line: str) -> int | None:
    """The bytes done in one line of rsync's `--info=progress2` (`  1,234,567  12%  ...`),
    None for any other line."""
    found = _PROGRESS_RE.match(line)
    if found is None:
        return None
    digits = found.group(1).replace(",", "").replace(".", "")
    return int(digits) if digits.isdigit() else None


_TICK_S = 0.1  # how often `run_rsync_watched` calls its `tick`


def run_rsync_watched(
    argv: Sequence[str],
    *,
    what: str,
    tick: Callable[[int], None],
    timeout: float | None = None,
    timeout_hint: str | None = None,
) -> None:
    """Run one rsync started with `PROGRESS_OPTIONS`, calling `tick(bytes done)` every
    `_TICK_S` from this thread while it runs (whether or not rsync printed), and once at its end.

    Errors as `run_rsync`'s. An exception from `tick` (or a timeout) ends rsync and its ssh
    (`_stop`: the transfer stops there, its partial files stay for the next run) and is raised
    as is."""
    proc = _start(argv, text=False, own_session=True)
    done = [0]
    said: list[bytes] = []
    assert proc.stdout is not None and proc.stderr is not None
    readers = [
        threading.Thread(target=_read_progress, args=(proc.stdout, done), daemon=True),
        threading.Thread(target=_read_tail, args=(proc.stderr, said), daemon=True),
    ]
    for reader in readers:
        reader.start()
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        while proc.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise TransferTimeout(
                    f"{what}: did not finish within {timeout:g} s; the transfer was stopped",
                    hint=timeout_hint,
                )
            tick(done[0])
            with contextlib.suppress(subprocess.TimeoutExpired):
                left = _TICK_S if deadline is None else deadline - time.monotonic()
                proc.wait(timeout=max(0.0, min(_TICK_S, left)))
    except BaseException:
        _stop(proc)
        raise
    for reader in readers:
        reader.join(timeout=5)
    tick(done[0])
    if proc.returncode != 0:
        raise rsync_failure(what, proc.returncode, b"".join(said).decode(errors="replace"))


def _stop(proc: subprocess.Popen) -> None:
    """End rsync and its ssh: SIGTERM first, on which rsync keeps what it received of a file
    (with `--partial`), SIGKILL after `STOP_GRACE_S`."""
    for sig, grace in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, None)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace)
            return


STOP_GRACE_S = 3.0


def _read_progress(stream: IO[bytes], done: list[int]) -> None:
    """Keep `done[0]` at the last bytes count rsync printed (lines end with CR or LF)."""
    pending = b""
    while chunk := stream.read1(65536):
        pending += chunk
        *lines, pending = re.split(rb"[\r\n]", pending)
        pending = pending[-4096:]
        # rsync starts each count with CR and ends it with nothing: the last piece is one too
        for line in [*lines, pending]:
            found = progress_bytes(line.decode(errors="replace"))
            if found is not None:
                done[0] = found


def _read_tail(stream: IO[bytes], said: list[bytes]) -> None:
    """Keep the last 64 KiB of what rsync writes to stderr."""
    kept = b""
    while chunk := stream.read1(65536):
        kept = (kept + chunk)[-65536:]
    said.append(kept)


def rsync_failure(what: str, returncode: int, said: str) -> RemoteError:
    """The error for an rsync that exited `returncode` having written `said`: HostKeyMismatch
    when the host key is not the pinned one, NodeUnreachable when ssh could not reach the
    host or lost it, else RemoteError with rsync's last lines."""
    if "Host key verification failed" in said:
        if "host key is known for" in said:  # ssh found no pinned key for the host at all
            return HostKeyMismatch(
                f"{what}: no host key is pinned for the node; connection refused",
                hint="the cluster's known_hosts lacks the node: `orch down` the cluster "
                "and launch again",
            )
        return HostKeyMismatch(
            f"{what}: the node presented a different host key than the one pinned for it; "
            "connection refused",
            hint="the host may have been replaced or intercepted: `orch down` the cluster "
            "and launch again",
        )
    detail = " | ".join(said.strip().splitlines()[-5:])
    if ssh_transport_failed(returncode, said):
        return NodeUnreachable(
            f"{what}: the node could not be reached or the connection dropped: {detail}"
        )
    return RemoteError(f"{what}: rsync exited {returncode}: {detail}")


def _kill(proc: subprocess.Popen[str], *, own_session: bool) -> None:
    """Kill rsync (with its ssh, when it runs in a session of its own) and reap it."""
    if own_session:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    else:
        proc.kill()
    proc.communicate()


@dataclass(frozen=True)
class Transfer:
    """One rsync to run as part of a fan-out, with a label for errors and progress."""

    label: str
    argv: list[str]


def run_parallel(
    transfers: Sequence[Transfer],
    *,
    timeout: float | None = None,
    on_done: Callable[[Transfer], None] | None = None,
    timeout_hint: str | None = None,
) -> None:
    """Run the transfers concurrently (one thread each), each stopped after `timeout` seconds
    (`run_rsync`); after all end, raise what failed: TransferTimeout when one was stopped (its
    hint `timeout_hint`), else RemoteError."""
    if not transfers:
        return
    errors: list[RemoteError] = []
    with ThreadPoolExecutor(max_workers=min(16, len(transfers))) as pool:
        futures = {
            pool.submit(
                run_rsync, t.argv, what=t.label, timeout=timeout, timeout_hint=timeout_hint
            ): t
            for t in transfers
        }
        for future, transfer in futures.items():
            try:
                future.result()
            except RemoteError as exc:
                errors.append(exc)
            else:
                if on_done is not None:
                    on_done(transfer)
    if errors:
        late = [e for e in errors if isinstance(e, TransferTimeout)]
        kind = TransferTimeout if late else RemoteError
        raise kind("; ".join(e.message for e in errors), hint=(late or errors)[0].hint)
