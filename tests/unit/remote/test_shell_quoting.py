"""Every command orch sends to a node survives hostile user input exactly.

Each builder of a remote command gets values with quotes, `$`, `;`, backticks, newlines,
spaces, globs and unicode, under a HOME that has them too. Argv builders must round-trip
through `shlex.split`; shell snippets are run by the real bash (no ssh needed) and what
arrives (argv, environment, files) is compared byte for byte. The same values travel to real
local nodes in tests/e2e/test_shell_safety.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import stat
import subprocess
import sys
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.errors import ConfigError
from orchestrator.node import file_write, launch, runtime
from orchestrator.node.checkpoint_files import CONTROL, refused_name
from orchestrator.node.checkpoint_protocol import (
    AgentConfig,
    AgentLayout,
    arm_command,
    parse_report,
    read_command,
)
from orchestrator.node.gpu import CPU_MARK, cpu_ticks_command, nvidia_smi_argv
from orchestrator.node.guard_protocol import GuardTerms
from orchestrator.remote.keys import HostAddress, Identity
from orchestrator.remote.ssh import shell_command
from orchestrator.remote.sync import (
    pull_argv,
    pull_file_argv,
    push_argv,
    rsync_argv,
    ssh_option_path,
    ssh_transport_argv,
)
from tests.support.fuzzing import examples
from tests.support.waiting import wait_until

HOSTILE = [
    "plain",
    "with space",
    "it's",
    'say "hi"',
    "$HOME",
    "${PATH}",
    "$(id -u)",
    "`id -u`",
    "a;b",
    "a && b || c",
    "a | b",
    "new\nline",
    "tab\there",
    "back\\slash",
    "üñí ☃ 日本",
    "*",
    "?[a]",
    "-n",
    "--help",
    "~",
    "~root",
    "#x",
    "!x",
    "{a,b}",
    "<in >out 2>&1",
    "%s%n",
    "\x1b[31mred",
    "'\"$`\\;\n mixed",
    " ",
    "",
]
NAMES = [v for v in HOSTILE if v.strip() and v not in ("~", "-n", "--help")]  # file names
text = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"))


def bash(script: str, home: Path, *, stdin: bytes | None = None) -> bytes:
    """Run `script` as a node's login shell would: bash -c, with HOME set; stdout bytes."""
    env = {"HOME": str(home), "PATH": os.environ["PATH"], "LC_ALL": "C.UTF-8"}
    result = subprocess.run(
        ["bash", "-c", script], env=env, input=stdin, capture_output=True, timeout=60, cwd=home
    )
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    return result.stdout


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A node HOME whose own path is hostile too."""
    path = tmp_path / "hö me $x;`y` 'q\""
    path.mkdir()
    return path


# --------------------------------------------------------------------------------------------
# argv builders: shlex.split gives back what went in


@settings(max_examples=examples(60), deadline=None)
@given(argv=st.lists(text, min_size=1, max_size=6))
def test_shell_command_round_trips_through_split_and_bash(argv: list[str]) -> None:
    command = shell_command(argv)
    assert shlex.split(command) == argv
    printed = subprocess.run(
        ["bash", "-c", shell_command(["printf", "%s\\0", *argv])],
        capture_output=True,
        check=True,
        timeout=30,
    ).stdout
    assert printed.decode().split("\0")[:-1] == argv


@pytest.mark.parametrize("value", HOSTILE)
def test_metadata_url_and_free_port_commands_round_trip(value: str) -> None:
    # the guard's notice watch reads its endpoint from its terms, never from a command line
    terms = GuardTerms("j", 1.0, 10.0, 60.0, None, 1.0, 0.0, 5.0, 10.0, notice_interval_s=2.0)
    doc = json.loads(
        terms.for_node(now=datetime.now(UTC), hourly_usd=Decimal(1), poweroff="true",
                       metadata_url=value)
    )  # fmt: skip
    assert (doc["metadata_url"], doc["notice_interval_s"]) == (value, 2.0)
    argv = shlex.split(launch.free_port_command(29500))
    assert argv[:2] == ["python3", "-c"] and argv[-1] == "29500"
    assert shlex.split(shell_command(nvidia_smi_argv(5))) == nvidia_smi_argv(5)


def _identity(root: Path) -> Identity:
    return Identity(root / "id_ed25519", "ssh-ed25519 AAAA test", root / "known_hosts", root / "c")


ADDRESS = HostAddress("node 0", "127.0.0.1", 2222, "root", "ssh-ed25519 AAAA")


def test_a_node_replaced_at_the_same_address_gets_its_own_ssh_master(tmp_path: Path) -> None:
    """A spot replacement reuses its predecessor's address; its transfers must not go through
    the master connection to the node it replaced (the socket is named by the host key)."""
    identity = _identity(tmp_path)
    replaced = HostAddress("node 0", "127.0.0.1", 2222, "root", "ssh-ed25519 BBBB")

    def control_path(address: HostAddress) -> str:
        argv = push_argv(tmp_path, address, identity, "~/x")
        transport = shlex.split(argv[argv.index("-e") + 1])
        return next(o for o in transport if o.startswith("ControlPath="))

    assert control_path(ADDRESS) != control_path(replaced)
    assert control_path(ADDRESS) == control_path(ADDRESS)


@pytest.mark.parametrize("value", NAMES)
def test_rsync_argv_keep_paths_whole(tmp_path: Path, value: str) -> None:
    keys = tmp_path / f"keys {value.replace('${', '$')}"  # ssh itself refuses ${ (below)
    local = tmp_path / f"src {value}"
    local.mkdir()
    identity = _identity(keys)
    transport = ssh_transport_argv(ADDRESS, identity, 10)
    argv = push_argv(local, ADDRESS, identity, f"~/{value}")
    assert "--protect-args" in argv  # remote names never pass through the node's shell
    assert shlex.split(argv[argv.index("-e") + 1]) == transport
    assert argv[-2:] == [f"{local}/", f"root@127.0.0.1:{value}/"]
    pulled = pull_argv(ADDRESS, identity, f"ck {value}", local, files_from=local / "list")
    assert pulled[-2:] == [f"root@127.0.0.1:ck {value}/", f"{local}/"]
    assert pull_file_argv(ADDRESS, identity, f"l {value}", local / "f")[-2] == (
        f"root@127.0.0.1:l {value}"
    )
    assert rsync_argv(["-x"], "y", transport=["ssh"])[-2:] == ["-x", "y"]


@pytest.mark.parametrize("value", [v for v in NAMES if "\n" not in v and "${" not in v])
def test_ssh_reads_the_quoted_key_and_known_hosts_paths_back(tmp_path: Path, value: str) -> None:
    """`ssh -G` prints the options as ssh understood them, without connecting."""
    identity = _identity(tmp_path / f"keys {value}")
    argv = ssh_transport_argv(ADDRESS, identity, 10)
    assert argv[0] == "ssh"
    shown = subprocess.run(
        ["ssh", "-G", *argv[1:], ADDRESS.host], capture_output=True, text=True, check=True
    ).stdout
    options = dict(line.split(" ", 1) for line in shown.splitlines() if " " in line)
    assert options["userknownhostsfile"] == str(identity.known_hosts)
    # IdentityFile is shown before ssh expands its %-tokens; %% is how a literal % is kept.
    assert options["identityfile"] == str(identity.private_key).replace("%", "%%")
    assert ssh_option_path('/a b/"q"\'s') == '"/a b/\\"q\\"\'s"'
    # nothing of the user's ssh config, no forwarding, no local command, whatever ssh's defaults
    assert argv[1:3] == ["-F", "/dev/null"]
    assert options["forwardagent"] == "no" and options["forwardx11"] == "no"
    assert options["clearallforwardings"] == "yes" and options["permitlocalcommand"] == "no"


def test_ssh_takes_aes_gcm_first_only_where_the_cpu_has_aes() -> None:
    from orchestrator.remote.sync import FAST_CIPHERS, cipher_option

    assert cipher_option(" fpu sse2 aes avx2") == ["-o", f"Ciphers={FAST_CIPHERS}"]
    assert cipher_option(" fp asimd aes pmull sha1") == ["-o", f"Ciphers={FAST_CIPHERS}"]  # arm
    assert cipher_option(" fpu sse2 aesni_fake") == [] and cipher_option(None) == []
    shown = subprocess.run(
        ["ssh", "-G", *cipher_option(" aes"), "node"], capture_output=True, text=True, check=True
    ).stdout
    assert f"ciphers {FAST_CIPHERS}" in shown.splitlines()  # an option ssh accepts as is


def test_a_key_path_that_ssh_would_expand_is_refused(tmp_path: Path) -> None:
    identity = _identity(tmp_path / "keys ${HOME}")
    with pytest.raises(ConfigError, match=r"ORCH_HOME without '\$\{'"):
        ssh_transport_argv(ADDRESS, identity, 10)


# --------------------------------------------------------------------------------------------
# shell snippets, run by bash


FAKE_TORCHRUN = """#!{python}
import json, os, subprocess, sys
args = sys.argv[1:]
command = args[args.index("--no-python") + 1:]
home = os.environ["HOME"]
with open(os.path.join(home, "torchrun.json"), "w") as out:
    json.dump({{"argv": args, "env": dict(os.environ), "cwd": os.getcwd()}}, out)
ran = subprocess.run(command, capture_output=True)
with open(os.path.join(home, "run.out"), "wb") as out:
    out.write(ran.stdout)
sys.exit(ran.returncode)
"""


@pytest.mark.parametrize("checkpoint_dir", ["ckpt {v}", "/abs {v}"], ids=["relative", "absolute"])
def test_launch_script_delivers_run_setup_env_and_paths_exactly(
    home: Path, tmp_path: Path, checkpoint_dir: str
) -> None:
    values = HOSTILE
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "torchrun"
    fake.write_text(FAKE_TORCHRUN.format(python=sys.executable))
    fake.chmod(0o755)
    job = "job-1"
    workdir = home / "orch-jobs" / job / "workdir"
    (home / "orch-jobs" / job / "run").mkdir(parents=True)
    workdir.mkdir()
    name = NAMES[-1]
    ckpt = checkpoint_dir.format(v=name)
    if ckpt.startswith("/"):
        ckpt = str(tmp_path / ckpt.lstrip("/"))
    cluster = launch.ClusterLaunch(
        job_id=job,
        run=shell_command(["printf", "%s\\0", *values]),
        setup=shell_command(["printf", "%s", values[-3]]) + ' > "$HOME/setup.out"',
        num_nodes=1,
        procs_per_node=1,
        master_addr="127.0.0.1",
        master_port=29500,
        node_ips=["127.0.0.1"],
        checkpoint_dir=launch.NodeLayout(job).node_path(
            ckpt if ckpt.startswith("/") else f"~/{ckpt}"
        ),
        resume_from=f"resume {name}",
        user_env={f"V{i}": value for i, value in enumerate(values)},
    )
    script = launch.launch_script(cluster, launch.NodeLaunch(0, "lo"))
    (home / "orch-jobs" / job / "run" / "launch.sh").write_text(script)
    env = {"HOME": str(home), "PATH": f"{bin_dir}:{os.environ['PATH']}", "LC_ALL": "C.UTF-8"}
    subprocess.run(
        ["bash", str(home / "orch-jobs" / job / "run" / "launch.sh")],
        env=env,
        check=True,
        timeout=60,
        capture_output=True,
    )
    seen = json.loads((home / "torchrun.json").read_text())
    assert seen["argv"][-3:] == ["bash", "-c", cluster.run]
    assert seen["cwd"] == str(workdir)
    for i, value in enumerate(values):
        assert seen["env"][f"V{i}"] == value
    expected_ckpt = ckpt if ckpt.startswith("/") else f"{home}/{ckpt}"
    assert seen["env"]["ORCH_CHECKPOINT_DIR"] == expected_ckpt
    assert Path(expected_ckpt).is_dir()
    assert seen["env"]["ORCH_RESUME_FROM"] == f"{home}/resume {name}"
    assert (home / "run.out").read_bytes().decode().split("\0")[:-1] == values
    assert (home / "setup.out").read_text() == values[-3]
    assert (home / "orch-jobs" / job / "run" / "exit_code").read_text().strip() == "0"


@pytest.mark.parametrize("name", NAMES)
def test_write_file_command_writes_exactly_there(home: Path, name: str) -> None:
    content = f"#!/bin/sh\n{name}\n".encode()
    bash(file_write.write_file_command(f"dir {name}/{name}", "0700"), home, stdin=content)
    path = home / f"dir {name}" / name
    assert path.read_bytes() == content
    assert stat.S_IMODE(path.stat().st_mode) == 0o700
    assert sorted(p.name for p in home.iterdir()) == [f"dir {name}"]


def test_the_checkpoint_agent_reports_hostile_names_under_a_hostile_home(home: Path) -> None:
    """Installed, armed and read back with the commands the controller sends, the agent
    reports every file by its exact name; names with control characters (a newline, a
    terminal escape) it does not take, and its problems say so."""
    job = "job-3"
    directory = "ck $(x) `y`"
    (home / directory).mkdir()
    layout = AgentLayout(job)
    bash(runtime.install_command(), home, stdin=runtime.install_input().encode())
    run_dir = home / launch.NodeLayout(job).run_dir
    run_dir.mkdir(parents=True)
    (run_dir / "pid").write_text(str(os.getpid()))  # "the run": this process
    config = AgentConfig(job, 0, directory).document()
    bash(arm_command(layout), home, stdin=json.dumps(config).encode())

    def report_when(ready) -> object:  # noqa: ANN001
        def report() -> object:
            found = parse_report(bash(read_command(layout), home).decode(), 0, 0, 0)
            return found if ready(found) else None

        return wait_until(
            report, "the agent's report", 20, interval=0.1,
            fail=lambda said: AssertionError(
                f"{said}\n{(home / layout.root / 'agent.log').read_text()}"
            ),
        )  # fmt: skip

    report_when(lambda r: r.agent == "alive" and r.manifest is not None)  # it took its baseline
    for i, name in enumerate(NAMES):
        (home / directory / name.replace("/", "_")).write_bytes(b"x" * i)
    (run_dir / "exit_code").write_text("0")  # the run ended: everything is staged at once
    report = report_when(lambda r: r.manifest is not None and r.manifest.done)
    names = {name.replace("/", "_"): i for i, name in enumerate(NAMES)}
    taken = {name: i for name, i in names.items() if refused_name(name) is None}
    assert len(taken) < len(names)  # some hold control characters
    assert {p: f.size for p, f in report.manifest.files.items()} == taken
    assert all(f.settled for f in report.manifest.files.values())
    (problem,) = report.manifest.problems
    assert "not taken" in problem and "control characters" in problem
    assert not CONTROL.search(problem)


def test_start_probe_stop_and_cpu_commands_under_a_hostile_home(home: Path) -> None:
    layout = launch.NodeLayout("job-2")
    run_dir = home / layout.run_dir
    run_dir.mkdir(parents=True)
    (run_dir / "launch.sh").write_text("sleep 30\n")
    pid = int(bash(launch.start_command(layout), home).decode().strip())
    try:
        probe = launch.parse_probe(bash(launch.probe_command(layout, 0), home).decode())
        assert probe.state == "running"
        cpu = bash(cpu_ticks_command(launch.home_expr(f"{layout.run_dir}/pid")), home).decode()
        assert cpu.startswith(CPU_MARK) and "none" not in cpu
        bash(launch.stop_command(layout, "KILL"), home)
        wait_until(
            lambda: launch.parse_probe(bash(launch.probe_command(layout, None), home).decode())
            .state != "running",
            "the run stopped by stop_command", 10, interval=0.1,
        )  # fmt: skip
    finally:
        # Not procps' `kill -9 -PGID`: once the group is gone it sends SIGKILL to -1, every
        # process of the machine (the CI runner included).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    tail = bash(f"tail -n 30 {launch.home_expr(layout.log)}", home)
    assert tail == b""
