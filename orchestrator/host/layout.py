"""Where orch keeps its files on a controller host, and the shell text that acts on them.

Pure: every function returns text or paths; nothing is run. Everything orch puts on a host lives
under one root directory (`HostLayout.root`, by default `~/.orch-host` of the login user):

    venv/           the orch installed from the laptop's wheel (no package index needed)
    wheels/         the pushed wheel
    home/           the host's ORCH_HOME: its SQLite ledger, keys, logs, pulled checkpoints
    env             the environment of every orch process there (0600)
    supervise.sh    the supervisor loop that restarts the daemon until it stops on purpose
    supervisor.pid  daemon.pid   daemon.log   state.json (the daemon's heartbeat)   stop
    submissions/    one folder per `orch submit --remote`: the spec, workdir and data sent

Every folder there is the login user's alone (0700) from its creation: whatever orch runs there
runs with umask 077 (`private_dirs`, `orch_command`, the supervisor, the daemon).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from orchestrator.errors import SpecError

DEFAULT_ROOT_NAME = ".orch-host"
DAEMON_MODULE = "orchestrator.host.daemon"
ROLE_TAG = "orch-role"
ROLE = "controller-host"
PURELIB = "import sysconfig; print(sysconfig.get_path('purelib'))"
# The daemon's unit on a host with systemd (`orchestrator.host.systemd`); start and stop use it
# where it is installed, and the shell supervisor elsewhere.
UNIT_NAME = "orch-controller.service"
UNIT_PATH = f"/etc/systemd/system/{UNIT_NAME}"


def as_root(command: str) -> str:
    """`command` run as root: directly when the login user is root, else with `sudo -n`."""
    return f'{{ if [ "$(id -u)" = 0 ]; then {command}; else sudo -n {command}; fi; }}'


@dataclass(frozen=True)
class Target:
    """A `user@addr[:port]` given to `--host`."""

    user: str
    host: str
    port: int


def parse_target(text: str, port: int | None = None) -> Target:
    """`user@addr` (user defaults to root, port to 22 unless `port` or `addr:port` says)."""
    user, _, address = text.rpartition("@")
    host, port_text = address, ""
    if address.count(":") == 1:
        host, port_text = address.split(":")
    if not host or " " in text:
        raise SpecError(f"--host {text!r}: give user@address", hint="e.g. root@10.0.0.5")
    try:
        chosen = port or (int(port_text) if port_text else 22)
    except ValueError:
        raise SpecError(f"--host {text!r}: the port is not a number") from None
    return Target(user=user or "root", host=host, port=chosen)


@dataclass(frozen=True)
class HostLayout:
    """The files of orch on one host, under the absolute path `root`."""

    root: str

    def path(self, name: str) -> str:
        return f"{self.root}/{name}"

    @property
    def venv(self) -> str:
        return self.path("venv")

    @property
    def python(self) -> str:
        return self.path("venv/bin/python")

    @property
    def orch(self) -> str:
        return self.path("venv/bin/orch")

    @property
    def home(self) -> str:
        return self.path("home")

    @property
    def env(self) -> str:
        return self.path("env")

    @property
    def log(self) -> str:
        return self.path("daemon.log")

    @property
    def state(self) -> str:
        return self.path("state.json")

    @property
    def stop_flag(self) -> str:
        return self.path("stop")

    @property
    def handover_flag(self) -> str:
        """Present while `orch controller up` hands a dead host's jobs over (the daemon is
        not idle then: the jobs reach its ledger only at the end)."""
        return self.path("handing-over")

    @property
    def submissions(self) -> str:
        return self.path("submissions")

    def submission(self, token: str) -> str:
        return self.path(f"submissions/{token}")


def private_dirs(paths: Sequence[str]) -> str:
    """Shell text that makes the folders `paths` (and their parents) mode 0700 as they are
    created (umask 077, never a later chmod)."""
    return f"umask 077 && mkdir -p {' '.join(shlex.quote(p) for p in paths)}"


def env_file_text(
    layout: HostLayout, extra: Mapping[str, str], image_bins: Sequence[str] = ()
) -> str:
    """The host's environment file: ORCH_HOME and PATH of the host's orch (then `image_bins`,
    where the image keeps the tools jobs need, torchrun among them), then `extra` (settings
    passed on from the laptop). Sourced by every orch process on the host."""
    path = ":".join(shlex.quote(p) for p in (layout.path("venv/bin"), *image_bins))
    lines = [
        f"export ORCH_HOME={shlex.quote(layout.home)}",
        f'export PATH={path}:"$PATH"',
        "export PYTHONUNBUFFERED=1",
    ]
    lines += [f"export {name}={shlex.quote(value)}" for name, value in sorted(extra.items())]
    return "\n".join(lines) + "\n"


def install_script(
    layout: HostLayout,
    python: str,
    site_dirs: Sequence[str],
    wheel: str,
    image_bins: Sequence[str] = (),
) -> str:
    """Install `wheel` (a file under `wheels/`) into the host's venv, offline.

    The venv is made with `python` and `--system-site-packages`; `site_dirs` (where the image
    keeps orch's dependencies) are added through a .pth file; pip installs the wheel only
    (`--no-index --no-deps`): the host needs no package index. The image's programs in
    `image_bins` (torchrun, ...) the venv lacks are linked into it, since local nodes of the
    host's jobs find programs in the venv of their controller. Prints the installed version.
    """
    q = shlex.quote
    pth = "".join(f"import site; site.addsitedir({d!r})\n" for d in site_dirs)
    return "\n".join(
        [
            "set -e",
            "umask 077",
            f"mkdir -p {q(layout.home)} {q(layout.path('wheels'))}",
            f"[ -x {q(layout.python)} ] || {q(python)} -m venv --without-pip "
            f"--system-site-packages {q(layout.venv)}",
            f"site=$({q(layout.python)} -c {q(PURELIB)})",
            f'printf %s {q(pth)} > "$site/_orch_image.pth"',
            f"{q(layout.python)} -m pip install --quiet --no-index --no-deps --force-reinstall "
            f"--disable-pip-version-check {q(layout.path('wheels/' + wheel))}",
            *(
                f'for f in {q(b)}/*; do n=$(basename "$f"); '
                f'[ -e {q(layout.path("venv/bin"))}/"$n" ] || '
                f'ln -s "$f" {q(layout.path("venv/bin"))}/"$n"; done'
                for b in image_bins
            ),
            f"{q(layout.python)} -c "
            + q("import importlib.metadata as m; print(m.version('orch'))"),
        ]
    )


def supervisor_script(layout: HostLayout) -> str:
    """The supervisor: runs the daemon again whenever it dies, until it exits 0 (autostop, or
    `orch controller down`) or the stop flag exists. Its own pid is in supervisor.pid."""
    q = shlex.quote
    return "\n".join(
        [
            "#!/bin/sh",
            "umask 077",
            f". {q(layout.env)}",
            f"echo $$ > {q(layout.path('supervisor.pid'))}",
            "while :; do",
            f"  {q(layout.python)} -m {DAEMON_MODULE} --root {q(layout.root)} "
            f">> {q(layout.log)} 2>&1",
            "  code=$?",
            '  [ "$code" = 0 ] && exit 0',
            f"  [ -e {q(layout.stop_flag)} ] && exit 0",
            f'  echo "$(date -u +%FT%TZ) daemon exited $code; restarting" >> {q(layout.log)}',
            "  sleep 1",
            "done",
            "",
        ]
    )


def alive_test(pid_file: str) -> str:
    """Shell test: the process whose pid is in `pid_file` (shell text, quoted or a variable)
    runs. A zombie does not (`kill -0` alone would say it does: a killed supervisor's daemon
    stays one where nothing reaps orphans)."""
    return (
        f"{{ [ -s {pid_file} ] && p=$(cat {pid_file}) && kill -0 $p 2>/dev/null && "
        "[ \"$(sed 's/.*) //' /proc/$p/stat 2>/dev/null | cut -c1)\" != Z ]; }"
    )


def start_command(layout: HostLayout) -> str:
    """Start the supervisor detached from the SSH session (its own session, no terminal),
    unless one already runs."""
    q = shlex.quote
    pid = q(layout.path("supervisor.pid"))
    return (
        f"rm -f {q(layout.stop_flag)}; "
        f"if [ -f {UNIT_PATH} ]; then {as_root(f'systemctl restart {UNIT_NAME}')} && "
        "echo started; "
        f"elif {alive_test(pid)}; then echo running; else "
        f"setsid nohup sh {q(layout.path('supervise.sh'))} > /dev/null 2>&1 < /dev/null & "
        "echo started; fi"
    )


def stop_command(layout: HostLayout, wait_s: int = 20) -> str:
    """Stop the supervisor and the daemon (flag, then TERM, then KILL after `wait_s`); prints
    `stopped` once neither runs."""
    q = shlex.quote
    pids = " ".join(q(layout.path(f"{n}.pid")) for n in ("supervisor", "daemon"))
    return (
        f"touch {q(layout.stop_flag)}; "
        f"[ -f {UNIT_PATH} ] && {as_root(f'systemctl stop {UNIT_NAME}')}; "
        f"for f in {pids}; do [ -s $f ] && kill $(cat $f) 2>/dev/null; done; "
        f"i=0; while [ $i -lt {wait_s * 5} ]; do alive=0; "
        f"for f in {pids}; do {alive_test('$f')} && alive=1; done; "
        "[ $alive = 0 ] && break; sleep 0.2; i=$((i+1)); done; "
        f"for f in {pids}; do [ -s $f ] && kill -9 $(cat $f) 2>/dev/null; rm -f $f; done; "
        "echo stopped"
    )


def free_port_command() -> str:
    """Command printing a TCP port free on the host now (the kernel's pick)."""
    script = (
        "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"
    )
    return f"python3 -c {shlex.quote(script)}"


def orch_command(layout: HostLayout, argv: Sequence[str], *, secrets_on_stdin: bool = False) -> str:
    """`orch ARGV` run on the host with its environment, everything it makes private to the
    login user (umask 077). `secrets_on_stdin`: the command's stdin holds `export NAME=value`
    lines (`submission.secrets_text`), read into orch's environment (never its arguments,
    never a file)."""
    q = shlex.quote
    sources = f"umask 077 && . {q(layout.env)}"
    if secrets_on_stdin:
        sources += ' && set -a && eval "$(cat)" && set +a'
    return f"{sources} && cd {q(layout.root)} && exec {q(layout.orch)} {shlex.join(argv)}"
