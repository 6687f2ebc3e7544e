"""`orch dashboard` as a test runs it: a real process on a free port, on loopback or on an
address of a network namespace of its own.

The command's contract, which `DashboardProcess` checks on the way:

- it prints `dashboard: http://ADDR:PORT/` once it listens, and with a token (any bind
  address that is not a loopback one) a line `token: TOKEN`;
- `GET /healthz` answers 200 `ok` with no token;
- SIGTERM or SIGINT stops it with exit code 0.

A non-loopback address is made with `namespace_address`: a fresh network namespace
(`tests.support.netns_host.private_host`) joined to the host by a veth pair, the namespace side
holding 10.217.N.2/24 and the host side 10.217.N.1/24 (N claimed atomically among tests
running side by side: the host side's name carries it). The dashboard runs in the namespace,
bound to 10.217.N.2, and is reached from the host like any machine on a LAN. At exit every
process of the namespace is killed and the namespace, its veth and its address removed.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from tests.support.helpers import ORCH, REPO, orch_env
from tests.support.netns_host import in_netns, nsenter_argv, private_host
from tests.support.waiting import wait_until

SUPERNET = "10.217"  # dashboards' namespaces: 10.217.N.0/24, N in 1..254
URL_LINE = re.compile(r"^dashboard: (http://\S+:\d+/)\s*$")
TOKEN_LINE = re.compile(r"^token: (\S+)\s*$")
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class NamespaceLink:
    """A network namespace reachable from the host at `address` (its side of a veth pair)."""

    ns: str
    address: str
    host_address: str
    veth: str


@contextlib.contextmanager
def namespace_address() -> Iterator[NamespaceLink]:
    """A fresh network namespace with 10.217.N.2 on its side of a veth pair to the host (which
    holds 10.217.N.1); everything of it removed at exit."""
    with private_host("orchd-") as ns:
        n, veth = _claim_veth(ns)
        try:
            link = NamespaceLink(ns, f"{SUPERNET}.{n}.2", f"{SUPERNET}.{n}.1", veth)
            for argv in (
                ["ip", "addr", "add", f"{link.host_address}/24", "dev", veth],
                ["ip", "link", "set", "dev", veth, "up"],
                ["ip", "-n", ns, "addr", "add", f"{link.address}/24", "dev", "eth0"],
                ["ip", "-n", ns, "link", "set", "dev", "eth0", "up"],
            ):
                subprocess.run(argv, check=True, capture_output=True)
            yield link
        finally:
            subprocess.run(["ip", "link", "del", "dev", veth], capture_output=True)


def _claim_veth(ns: str) -> tuple[int, str]:
    """A free subnet number N and the veth pair `odsh<N>` (host) / `eth0` (in `ns`) made for it:
    creating the host side claims N, as two pairs cannot share the name."""
    for n in random.sample(range(1, 255), 254):
        veth = f"odsh{n}"
        argv = ["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns]
        if subprocess.run(argv, capture_output=True).returncode == 0:
            return n, veth
    raise AssertionError(f"no free {SUPERNET}.N.0/24 subnet for a dashboard's namespace")


def free_port(address: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on at `address` now."""
    with socket.socket() as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


class DashboardProcess:
    """`orch dashboard --port P --bind ADDR [--allow-actions]` running while the context is open.

    `home` is its ORCH_HOME (environment from `tests.support.helpers.orch_env`, then `env`).
    With `link`, it runs in that namespace bound to `link.address`; else bound to `bind`.
    `port` defaults to a free one. `command` replaces `orch dashboard` (the harness's own test
    runs a stand-in that keeps the same contract).

    Entering waits until the URL line is printed (and the token line for a non-loopback
    address) and `/healthz` answers `ok`. Exiting stops it (SIGTERM) and fails when it does not
    end with code 0. `.url`, `.token` (None without one), `.output` (all it printed so far),
    `.stop(sig)`."""

    def __init__(
        self,
        home: Path,
        *,
        bind: str = "127.0.0.1",
        link: NamespaceLink | None = None,
        port: int | None = None,
        allow_actions: bool = False,
        env: dict[str, str] | None = None,
        command: Sequence[str] | None = None,
    ) -> None:
        self.home = home
        self.link = link
        self.bind = link.address if link else bind
        if port is None:
            port = in_netns(link.ns, free_port, self.bind) if link else free_port(self.bind)
        self.port = port
        self.allow_actions = allow_actions
        self.env = orch_env(home, **(env or {}))
        self.command = list(command) if command else [*ORCH, "dashboard"]
        self.url = ""
        self.token: str | None = None
        self.returncode: int | None = None
        self._lines: list[str] = []
        self._process: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None

    @property
    def output(self) -> str:
        """Everything the command printed so far (stdout and stderr, in order)."""
        return "".join(self._lines)

    @property
    def needs_token(self) -> bool:
        return not ipaddress.ip_address(self.bind).is_loopback

    def argv(self) -> list[str]:
        argv = [*self.command, "--port", str(self.port), "--bind", self.bind]
        if self.allow_actions:
            argv.append("--allow-actions")
        return [*nsenter_argv(self.link.ns), *argv] if self.link else argv

    def start(self) -> None:
        """Start it and wait until it serves (see the class)."""
        self._process = subprocess.Popen(
            self.argv(),
            env=self.env,
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True, name="dashboard-out")
        self._reader.start()
        wait_until(
            self._announced, "the dashboard to print its URL", START_TIMEOUT_S, fail=self._fail
        )
        expected = f"http://{self._authority()}/"
        if self.url != expected:
            raise self._fail(f"it announced {self.url}, not {expected}")
        if self.needs_token:
            wait_until(self._token, "the dashboard to print its token", 5.0, fail=self._fail)
        else:
            self._token()
        wait_until(self._healthy, "GET /healthz to answer ok", 10.0, fail=self._fail)

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> int:
        """Send `sig` and return the exit code (SIGKILL after `STOP_TIMEOUT_S` s, and fail)."""
        process = self._process
        if process is None:
            raise AssertionError("the dashboard was never started")
        if process.poll() is None:
            process.send_signal(sig)
            try:
                process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                raise self._fail(f"still running {STOP_TIMEOUT_S:.0f} s after {sig.name}") from None
        if self._reader is not None:
            self._reader.join(5)
        self.returncode = process.returncode
        return process.returncode

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
        """Status and body of a GET of `path` (no token unless `headers` carry one)."""
        request = urllib.request.Request(self.url.rstrip("/") + path, headers=headers or {})
        try:
            with urllib.request.urlopen(request, timeout=10) as reply:
                return reply.status, reply.read().decode(errors="replace")
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")

    def __enter__(self) -> DashboardProcess:
        try:
            self.start()
        except BaseException:
            self._kill()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._process is None:
            return
        try:
            code = self.stop()
        finally:
            self._kill()
        if kind is None and code != 0:
            raise self._fail(f"exited {code} on SIGTERM, not 0")

    def _authority(self) -> str:
        host = f"[{self.bind}]" if ":" in self.bind else self.bind
        return f"{host}:{self.port}"

    def _read(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        for line in self._process.stdout:
            self._lines.append(line)

    def _printed(self, pattern: re.Pattern[str]) -> str | None:
        """The first group of the first line printed so far that matches `pattern`."""
        for line in list(self._lines):
            found = pattern.match(line)
            if found:
                return found.group(1)
        return None

    def _announced(self) -> bool:
        self.url = self._printed(URL_LINE) or ""
        if not self.url and self._process is not None and self._process.poll() is not None:
            time.sleep(0.2)  # let the reader take its last lines
            raise self._fail(f"exited {self._process.returncode} before it listened")
        return bool(self.url)

    def _token(self) -> bool:
        self.token = self._printed(TOKEN_LINE)
        return self.token is not None

    def _healthy(self) -> bool:
        with contextlib.suppress(OSError):
            status, body = self.get("/healthz")
            return status == 200 and body.strip() == "ok"
        return False

    def _fail(self, message: str) -> AssertionError:
        return AssertionError(f"orch dashboard ({' '.join(self.argv())}): {message}\n{self.output}")

    def _kill(self) -> None:
        """SIGKILL its process group if anything of it is left."""
        if self._process is not None and self._process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, signal.SIGKILL)
            self._process.wait()
