"""`orchestrator.host.layout`: `--host` targets, and the shell text orch runs on a controller
host. The scripts are run here with `sh` on a scratch root (a fake venv whose `python` and
`orch` are small shell scripts), so what they do is checked, not how they read."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from orchestrator.errors import SpecError
from orchestrator.host.layout import (
    HostLayout,
    Target,
    alive_test,
    env_file_text,
    orch_command,
    parse_target,
    start_command,
    stop_command,
    supervisor_script,
)
from tests.support.waiting import wait_until

TRICKY = 'it\'s $HOME; `echo no` "x" \\ \n2nd line'


@pytest.mark.parametrize(
    ("text", "port", "expected"),
    [
        ("ubuntu@10.0.0.5", None, Target("ubuntu", "10.0.0.5", 22)),
        ("10.0.0.5", None, Target("root", "10.0.0.5", 22)),
        ("me@host.example:2222", None, Target("me", "host.example", 2222)),
        ("me@host.example:2222", 2022, Target("me", "host.example", 2022)),
        ("me@10.0.0.5", 2022, Target("me", "10.0.0.5", 2022)),
    ],
)
def test_parse_target(text: str, port: int | None, expected: Target) -> None:
    assert parse_target(text, port) == expected


@pytest.mark.parametrize("text", ["me@", "", "me@a b", "me@host:port"])
def test_parse_target_refuses(text: str) -> None:
    with pytest.raises(SpecError):
        parse_target(text)


def _sh(script: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", "-c", script], capture_output=True, text=True, timeout=30, check=False, **kwargs
    )  # type: ignore[call-overload]


def _fake_venv(layout: HostLayout, python: str = "exit 0", orch: str = "exit 0") -> None:
    bin_dir = Path(layout.path("venv/bin"))
    bin_dir.mkdir(parents=True)
    for name, body in (("python", python), ("orch", orch)):
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)


def test_the_env_file_sets_home_path_and_the_passed_settings_verbatim(tmp_path: Path) -> None:
    layout = HostLayout(str(tmp_path / "root dir"))
    env = Path(layout.env)
    env.parent.mkdir()
    env.write_text(env_file_text(layout, {"ORCH_X": TRICKY, "ORCH_Y": ""}, ["/image/bin"]))
    done = _sh(f'. "{env}"; printf "%s|%s|%s|%s" "$ORCH_HOME" "$ORCH_X" "$ORCH_Y" "$PATH"')
    home, x, y, path = done.stdout.split("|")
    assert (home, x, y) == (layout.home, TRICKY, "")
    assert path.startswith(f"{layout.path('venv/bin')}:/image/bin:")


def test_orch_command_passes_argv_verbatim_and_reads_the_secrets_from_stdin(
    tmp_path: Path,
) -> None:
    layout = HostLayout(str(tmp_path / "root"))
    _fake_venv(layout, orch='printf "%s\\n" "$PWD" "$SECRET" "$@"')
    Path(layout.env).write_text(env_file_text(layout, {}))
    argv = ["submit", "job one.yaml", TRICKY, "--json"]
    command = orch_command(layout, argv, secrets_on_stdin=True)
    # no `export`: `set -a` must export it
    done = subprocess.run(["sh", "-c", command], input="SECRET='a b'\n", capture_output=True,
                          text=True, timeout=30)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:-1] == [layout.root, "a b", *argv[:2], *TRICKY.split("\n"),
                                           "--json"]  # fmt: skip
    assert "a b" not in command


def _supervise(tmp_path: Path, python: str) -> tuple[HostLayout, subprocess.CompletedProcess[str]]:
    """Run the supervisor in the foreground with a fake daemon `python`."""
    layout = HostLayout(str(tmp_path / "root"))
    _fake_venv(layout, python=python)
    Path(layout.env).write_text(env_file_text(layout, {}))
    script = Path(layout.path("supervise.sh"))
    script.write_text(supervisor_script(layout))
    return layout, subprocess.run(
        ["sh", str(script)], capture_output=True, text=True, timeout=30, check=False
    )


def test_the_supervisor_restarts_a_dying_daemon_until_it_exits_0(tmp_path: Path) -> None:
    count = tmp_path / "runs"
    daemon = (
        f'echo x >> "{count}"; echo "run $(wc -l < "{count}") $*"; '
        f'[ "$(wc -l < "{count}")" -ge 3 ] && exit 0; exit 7'
    )
    layout, done = _supervise(tmp_path, daemon)
    assert done.returncode == 0
    assert len(count.read_text().splitlines()) == 3, "two crashes, then the clean exit"
    log = Path(layout.log).read_text()
    assert log.count("daemon exited 7; restarting") == 2
    assert f"-m orchestrator.host.daemon --root {layout.root}" in log
    assert int(Path(layout.path("supervisor.pid")).read_text()) > 0


def test_the_supervisor_stops_once_the_stop_flag_exists(tmp_path: Path) -> None:
    count = tmp_path / "runs"
    flag = tmp_path / "root" / "stop"
    # The daemon dies with an error, but only after setting the flag (as autostop does).
    layout, done = _supervise(tmp_path, f'echo x >> "{count}"; touch "{flag}"; exit 9')
    assert done.returncode == 0
    assert len(count.read_text().splitlines()) == 1, "restarted although the flag was set"
    assert "restarting" not in Path(layout.log).read_text()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def test_start_starts_one_supervisor_and_stop_ends_it_and_its_daemon(tmp_path: Path) -> None:
    layout = HostLayout(str(tmp_path / "root"))
    ready = tmp_path / "daemon-started"
    _fake_venv(layout, python=f'echo $$ > "{layout.path("daemon.pid")}"; touch "{ready}"; '
                              "exec sleep 60")  # fmt: skip
    Path(layout.env).write_text(env_file_text(layout, {}))
    Path(layout.path("supervise.sh")).write_text(supervisor_script(layout))
    Path(layout.stop_flag).touch()  # left by an earlier stop: start must clear it

    assert _sh(start_command(layout)).stdout.strip() == "started"
    wait_until(ready.exists, "the daemon started by the supervisor", 10, interval=0.05)
    assert not Path(layout.stop_flag).exists()
    supervisor = int(Path(layout.path("supervisor.pid")).read_text())
    daemon = int(Path(layout.path("daemon.pid")).read_text())
    assert _alive(supervisor) and _alive(daemon)
    assert _sh(start_command(layout)).stdout.strip() == "running", "a second supervisor"

    done = _sh(stop_command(layout, wait_s=5))
    assert done.stdout.strip() == "stopped", done.stderr
    assert not _alive(supervisor) and not _alive(daemon)
    assert Path(layout.stop_flag).exists()
    assert not Path(layout.path("daemon.pid")).exists()
    assert _sh(stop_command(layout, wait_s=1)).stdout.strip() == "stopped", "not idempotent"


def _zombie(pid: int) -> bool:
    """`pid` exited and is not waited for."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"


def test_a_zombie_is_not_taken_for_a_running_daemon(tmp_path: Path) -> None:
    """A killed supervisor leaves its daemon a zombie where nothing reaps orphans; `kill -0`
    alone says it runs, and `up` would not start the daemon again."""
    pid_file = tmp_path / "daemon.pid"
    test = f"{alive_test(str(pid_file))} && echo running || echo stopped"
    pid_file.write_text(f"{os.getpid()}\n")
    assert subprocess.run(["sh", "-c", test], capture_output=True, text=True).stdout == "running\n"
    child = os.fork()
    if child == 0:
        os._exit(0)
    try:
        wait_until(lambda: _zombie(child), "the child a zombie", 10, interval=0.02)
        pid_file.write_text(f"{child}\n")
        shown = subprocess.run(["sh", "-c", test], capture_output=True, text=True).stdout
        assert shown == "stopped\n"
    finally:
        os.waitpid(child, 0)
