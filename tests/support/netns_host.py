"""A private network namespace that stands in for the host, for tests that change its firewall.

iptables' rules and policies, `net.bridge.bridge-nf-call-iptables` and the interfaces all belong
to a network namespace. A test that sets Docker's FORWARD policy DROP in the real host's
namespace would cut off the local nodes of every other test running beside it; in a namespace
of its own it changes nothing of theirs, and deleting the namespace removes every table, chain,
bridge and veth made in it.

Code runs there in two ways: `in_netns` calls a function in a thread that entered the namespace
(processes it starts are in it too), and `nsenter_argv` prefixes a command line. The node
namespaces the local provider makes (`ip netns add`) are global names, as on a real host.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def nsenter_argv(ns: str) -> list[str]:
    """Prefix that runs a command in network namespace `ns` (the host's mounts kept)."""
    return ["nsenter", f"--net=/run/netns/{ns}", "--"]


def in_netns(ns: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)` run in network namespace `ns`, in a thread of its own (a namespace is a
    thread's: the test's own thread never leaves the host's)."""
    result: dict[str, Any] = {}

    def enter_and_call() -> None:
        try:
            fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
            try:
                if _libc.setns(fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns into {ns} failed")
            finally:
                os.close(fd)
            result["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # handed to the caller's thread
            result["error"] = exc

    thread = threading.Thread(target=enter_and_call, name=f"in-{ns}")
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["value"]


def sh(ns: str, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run `argv` in network namespace `ns`."""
    out = subprocess.run([*nsenter_argv(ns), *argv], capture_output=True, text=True, timeout=60)
    if check and out.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} in {ns} failed: {out.stderr}")
    return out


@contextlib.contextmanager
def private_host(prefix: str = "orchh-") -> Iterator[str]:
    """A fresh network namespace with its loopback up; every process still in it is killed and
    the namespace deleted afterwards, which removes all that was made in it."""
    ns = prefix + secrets.token_hex(4)
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
        yield ns
    finally:
        kill_in_netns(ns)
        subprocess.run(["ip", "netns", "del", ns], check=False)


def kill_in_netns(ns: str) -> None:
    """SIGKILL every process of network namespace `ns`."""
    pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout
    for pid in pids.split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
