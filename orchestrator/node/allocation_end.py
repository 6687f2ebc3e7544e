"""Ending one allocation on a machine the user already has: its processes, its key, its files.
The machine itself, its sshd and everything else on it stay.

The `allocation-end` program of the node runtime (`orchestrator.node.runtime`):

    python3 orch-node-<version>.pyz allocation-end --home H --marker orch-allocation:<id>

`H` is the allocation's home, `<login home>/.orch-fleet/<id>` (absolute, normalised; its last
part is the id the marker names, and the environment's HOME, when set, is H itself or that login
home: the program runs as the guard's poweroff, with HOME=H, or over the login's own
connection). In order:

1. every process of this user (real uid) whose environment (`/proc/PID/environ`) holds
   `HOME=H`, but this one, gets SIGTERM; those still there after `GRACE_S` get SIGKILL, again
   until none is left (a process that forks anew is caught in a later round);
2. the line(s) of the login's `~/.ssh/authorized_keys` whose last word is the marker are
   removed: the file is rewritten whole beside itself and renamed over (its mode kept), the
   other lines byte for byte as they were; an append made meanwhile is noticed (size, inode
   and time) and the rewrite done again. Writers that also lock `LOCK_NAME` (in
   `~/.orch-fleet/`, `flock`) never race it;
3. H is removed: a symlink in it is removed, never followed (H itself a symlink: only the
   link goes).

Prints one JSON line, `{"home": H, "processes": N, "keys": N, "files": N, "errors": [...]}`
(processes ended, authorized_keys lines removed, files and folders removed), and exits 0, or
1 when something could not be done (said in `errors`, after the rest was done), or 2 when the
arguments are refused (nothing done). Run again, it finds nothing left and says so.

`allocation_end_command` is the shell text that runs it (the guard's poweroff, the provider's
terminate). Standard library only, Python 3.8 or newer.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import shlex
import shutil
import signal
import sys
import tempfile
import time

FLEET_DIR = ".orch-fleet"  # in the login's home: one folder per allocation, and `cache`
MARKER_PREFIX = "orch-allocation:"
LOCK_NAME = ".authorized_keys.lock"  # in FLEET_DIR: held while authorized_keys is rewritten
GRACE_S = 5.0  # SIGTERM -> SIGKILL
KILL_ROUNDS = 50  # SIGKILL rounds, `ROUND_S` apart, for processes that fork anew
ROUND_S = 0.1
MAX_KEYS_BYTES = 16 * 2**20  # a larger authorized_keys is not rewritten
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def allocation_end_command(runtime_path: str, home: str, marker: str) -> str:
    """Shell text that runs `allocation-end` of the node runtime at `runtime_path` (absolute,
    or relative to the running shell's HOME) for the allocation at `home` with `marker`, from
    `/` (the allocation's home goes away under it). Pure; every value is quoted."""
    where = (
        shlex.quote(runtime_path)
        if runtime_path.startswith("/")
        else (f'"$HOME"/{shlex.quote(runtime_path)}')
    )
    args = shlex.join(["allocation-end", "--home", home, "--marker", marker])
    return f"(cd / && python3 -u {where} {args})"


def refusal(home: str, marker: str, env_home: str | None) -> str | None:
    """Why `home` and `marker` are refused (None: they are not): `home` must be an absolute,
    normalised `<login home>/.orch-fleet/<id>` (not the shared `cache`), the marker
    `orch-allocation:<id>` for that same id, and `env_home` (the environment's HOME, when set)
    `home` itself or its login home."""
    if not home.startswith("/") or os.path.normpath(home) != home:
        return f"the home {home!r} is not an absolute, normalised path"
    parent, name = os.path.split(home)
    if os.path.basename(parent) != FLEET_DIR or not _ID.match(name) or name == "cache":
        return f"the home {home!r} is not an allocation's folder in ~/{FLEET_DIR}/"
    if marker != MARKER_PREFIX + name:
        return f"the marker {marker!r} is not this allocation's ({MARKER_PREFIX}{name})"
    login = os.path.dirname(parent)
    if env_home is not None and os.path.normpath(env_home) not in (home, login):
        return f"the home {home!r} is not under ~/{FLEET_DIR}/ (HOME is {env_home!r})"
    return None


def without_marker(text: bytes, marker: str) -> tuple[bytes, int]:
    """authorized_keys `text` without the lines whose last word is `marker` (the others byte
    for byte, line ends included), and how many lines went."""
    kept, removed = [], 0
    want = marker.encode()
    for line in text.splitlines(keepends=True):
        words = line.split()
        if words and words[-1] == want:
            removed += 1
        else:
            kept.append(line)
    return b"".join(kept), removed


# --- processes ----------------------------------------------------------------------------------


def _environ_home(pid: int, home: str) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            env = fh.read(1 << 20).split(b"\0")
    except OSError:
        return False
    want = os.fsencode(home)
    return any(v.startswith(b"HOME=") and os.path.normpath(v[5:]) == want for v in env)


def _real_uid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def processes_of(home: str) -> list[int]:
    """Pids of this user's processes whose environment holds HOME=`home`, but this one."""
    me, uid = os.getpid(), os.getuid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        pid = int(entry)
        if _real_uid(pid) == uid and _environ_home(pid, home):
            found.append(pid)
    return found


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, sig)


def end_processes(home: str, grace_s: float = GRACE_S) -> int:
    """SIGTERM, then after `grace_s` SIGKILL (in rounds), to every process of `home`; how many
    processes were seen."""
    seen = set(processes_of(home))
    _signal(sorted(seen), signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        left = processes_of(home)
        seen.update(left)
        if not left:
            return len(seen)
        _signal(left, signal.SIGTERM)  # a child started after the first round hears it too
        time.sleep(ROUND_S)
    for _ in range(KILL_ROUNDS):
        left = processes_of(home)
        seen.update(left)
        if not left:
            break
        _signal(left, signal.SIGKILL)
        time.sleep(ROUND_S)
    return len(seen)


# --- authorized_keys ----------------------------------------------------------------------------


def _fingerprint(st: os.stat_result) -> tuple[int, int, int]:
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def remove_key_lines(login_home: str, marker: str) -> int:
    """Remove the lines ending in `marker` from `login_home`/.ssh/authorized_keys (a symlinked
    file is rewritten where it leads); how many went. Raises OSError when it cannot."""
    path = os.path.join(login_home, ".ssh", "authorized_keys")
    if not os.path.lexists(path):
        return 0
    path = os.path.realpath(path)
    os.makedirs(os.path.join(login_home, FLEET_DIR), mode=0o700, exist_ok=True)
    with open(os.path.join(login_home, FLEET_DIR, LOCK_NAME), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for _ in range(5):
            st = os.stat(path)
            if st.st_size > MAX_KEYS_BYTES:
                raise OSError(f"{path} is larger than {MAX_KEYS_BYTES} bytes; left as it is")
            with open(path, "rb") as fh:
                text = fh.read(MAX_KEYS_BYTES + 1)
            kept, removed = without_marker(text, marker)
            if not removed:
                return 0
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".authorized_keys.")
            try:
                with os.fdopen(fd, "wb") as out:
                    out.write(kept)
                    out.flush()
                    os.fsync(out.fileno())
                os.chmod(tmp, st.st_mode & 0o7777)
                if _fingerprint(os.stat(path)) != _fingerprint(st):
                    continue  # written meanwhile: read it again
                os.replace(tmp, path)
                tmp = ""
                return removed
            finally:
                if tmp:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp)
    raise OSError(f"{path} kept changing while its line was being removed; try again")


# --- files --------------------------------------------------------------------------------------


def remove_home(home: str, errors: list[str]) -> int:
    """Remove `home` (a symlink: the link only), never following a symlink inside it; how many
    files and folders went. What could not be removed is added to `errors`."""
    if os.path.islink(home):
        os.unlink(home)
        return 1
    if not os.path.isdir(home):
        return 0
    count, before = 1, len(errors)
    for _root, dirs, files in os.walk(home, followlinks=False):
        count += len(dirs) + len(files)

    def failed(_function, path, exc):  # noqa: ANN001 - shutil's callback signature
        errors.append(f"cannot remove {path}: {exc[1] if isinstance(exc, tuple) else exc}")

    if sys.version_info >= (3, 12):
        shutil.rmtree(home, onexc=failed)
    else:
        shutil.rmtree(home, onerror=failed)
    return count - (len(errors) - before)


def end(home: str, marker: str, *, grace_s: float = GRACE_S) -> dict:
    """Steps 1-3 for the allocation at `home` (arguments already checked): the JSON report."""
    errors: list[str] = []
    ended = end_processes(home, grace_s)
    keys = 0
    try:
        keys = remove_key_lines(os.path.dirname(os.path.dirname(home)), marker)
    except OSError as exc:
        errors.append(f"authorized_keys: {exc}")
    files = 0
    try:
        files = remove_home(home, errors)
    except OSError as exc:
        errors.append(f"cannot remove {home}: {exc}")
    return {"home": home, "processes": ended, "keys": keys, "files": files, "errors": errors}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="allocation-end")
    parser.add_argument("--home", required=True)
    parser.add_argument("--marker", required=True)
    args = parser.parse_args(argv)
    why = refusal(args.home, args.marker, os.environ.get("HOME"))
    if why is None and os.path.islink(os.path.dirname(args.home)):
        why = f"~/{FLEET_DIR} is a symlink; refused"
    if why is not None:
        print(json.dumps({"home": args.home, "refused": why}), flush=True)
        return 2
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # the connection that started it may go
    report = end(args.home, args.marker)
    with contextlib.suppress(OSError):  # whoever started it may be gone: it was done anyway
        print(json.dumps(report), flush=True)
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
