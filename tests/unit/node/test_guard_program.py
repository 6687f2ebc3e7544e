"""The node guard's decisions and the controller's side of it: terms, leases, boot parts.

The guard program runs here as it runs on a node, against real files in a temporary home; no
process is signalled and nothing is powered off (its `act` is not called).
"""

from __future__ import annotations

import ast
import gzip
import json
import os
import signal
import subprocess
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import yaml

from orchestrator.control.money.stop_rules import guard_limit_at
from orchestrator.node import guard
from orchestrator.node.guard_protocol import (
    GuardLayout,
    GuardLease,
    GuardTerms,
    cloud_init_parts,
    guard_program,
    lease_until,
    parse_status,
)
from orchestrator.node.source_text import compact_source
from orchestrator.providers.aws.ec2_requests import USER_DATA_LIMIT, new_host_key, packed, user_data
from tests.support.guard_keys import LeaseKey
from tests.support.waiting import wait_until

NOW = datetime(2026, 12, 2, 4, 0, tzinfo=UTC)


def terms(**overrides: object) -> GuardTerms:
    base: dict = dict(
        job_id="j-1",
        interval_s=1.0,
        silence_s=10.0,
        allowance_s=100.0,
        deadman_s=600.0,
        stop_grace_s=5.0,
        upload_wait_s=0.0,
        idle_util_pct=5.0,
        idle_cpu_pct=10.0,
    )
    base.update(overrides)
    return GuardTerms(**base)


def test_the_lease_never_reaches_past_what_the_budget_buys() -> None:
    # $1 left at $3.60/h buys 1000 s; 20 s are kept back for the stop itself.
    until = lease_until(
        now=NOW, budget_left_usd=Decimal("1"), hourly_usd=Decimal("3.6"), reserve_s=20
    )
    assert until == NOW + timedelta(seconds=980)
    spent = lease_until(
        now=NOW, budget_left_usd=Decimal("-0.5"), hourly_usd=Decimal(1), reserve_s=0
    )
    assert spent == NOW
    assert lease_until(now=NOW, budget_left_usd=None, hourly_usd=Decimal(1), reserve_s=0) is None
    free = lease_until(now=NOW, budget_left_usd=Decimal(1), hourly_usd=Decimal(0), reserve_s=0)
    assert free is None


def test_a_node_gets_its_lease_from_the_launch_price() -> None:
    doc = json.loads(
        terms(budget_left_usd=Decimal("0.5"), runtime_deadline=NOW + timedelta(hours=1)).for_node(
            now=NOW, hourly_usd=Decimal("1.8"), poweroff="shutdown -h now", home="/home/u"
        )
    )
    assert doc["lease_until"] == (NOW + timedelta(seconds=1000 - 20)).timestamp()
    assert doc["runtime_deadline"] == (NOW + timedelta(hours=1)).timestamp()
    assert doc["poweroff"] == "shutdown -h now" and doc["home"] == "/home/u"
    assert "budget_left_usd" not in doc


def test_cloud_init_arms_the_guard_as_a_unit_within_ec2s_user_data_limit() -> None:
    document = terms().for_node(
        now=NOW, hourly_usd=Decimal(1), poweroff="shutdown -h now", home="/home/ubuntu"
    )
    text = user_data("ssh-ed25519 AAAA test", new_host_key(), document)
    sent = packed(text)
    assert len(sent) <= USER_DATA_LIMIT - 3072, len(sent)  # room for the guard to grow
    assert gzip.decompress(sent).decode() == text
    config = yaml.safe_load(text)
    paths = {f["path"] for f in config["write_files"]}
    assert {"/opt/orch-guard/guard.py", "/opt/orch-guard/terms.json"} <= paths
    assert "/etc/systemd/system/orch-guard.service" in paths
    assert "systemctl enable --now orch-guard.service" in config["runcmd"][0][2]
    assert config["ssh_keys"]["ed25519_public"].startswith("ssh-ed25519 ")
    assert set(cloud_init_parts(document)) == {"write_files", "runcmd"}


def test_the_program_sent_to_nodes_is_the_same_code_without_comments_or_docstrings() -> None:
    folder = Path(guard.__file__).parent
    for name, shipped in guard_program().items():
        source = "runtime_main.py" if name == "__main__.py" else name  # the runtime's entry
        tree = ast.parse((folder / source).read_text())
        for node in ast.walk(tree):
            body = getattr(node, "body", None)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and body:
                first = body[0]
                if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                    first.value.value = ""
        assert ast.dump(ast.parse(shipped)) == ast.dump(tree), name
    text = 'x = "# not a comment"  # a comment\ndef f():\n    """Doc."""\n    return "kept"\n'
    assert compact_source(text) == 'x = "# not a comment"\ndef f():\n    ""\n    return "kept"\n'


def test_the_status_parser_trusts_only_the_guards_json() -> None:
    alive = parse_status('{"pid": 12, "problem": null}\n@@orch-guard-alive\n')
    assert alive.armed and alive.problem is None
    dead = parse_status('{"pid": 12, "problem": "sudo asks for a password"}\n')
    assert not dead.armed and dead.problem == "sudo asks for a password"
    assert parse_status("garbage\n@@orch-guard-alive") == parse_status("")
    assert not parse_status("").armed
    assert parse_status("[" * 200_000 + "\n@@orch-guard-alive") == parse_status("")


def test_the_guard_finds_the_program_behind_env_and_setsid() -> None:
    line = "env -u ORCH_LOCAL_NODE PYTHONPATH=/x setsid /usr/bin/python3 -m m >> log 2>&1 &"
    assert guard.first_program(line.split()) == "/usr/bin/python3"
    assert guard.first_program(["sudo", "shutdown", "-h", "now"]) == "sudo"
    assert guard.first_program(["env"]) is None


def rsync_writing_as(home: Path) -> subprocess.Popen[bytes]:
    """A real rsync that waits on its (remote shell) peer for 30 s, with HOME `home`."""
    (home / "f").touch()
    sync = subprocess.Popen(
        ["rsync", "-e", "sh -c 'sleep 30' --", "f", "peer:/d"],
        cwd=home, env={**os.environ, "HOME": str(home)}, start_new_session=True,
    )  # fmt: skip
    # returned once the child runs rsync itself: on a busy machine the forked child can still
    # be this interpreter when the guard first looks
    wait_until(
        lambda: Path(f"/proc/{sync.pid}/cmdline").read_bytes().startswith(b"rsync"),
        "rsync's start", 10, interval=0.01,
    )  # fmt: skip
    return sync


def test_a_sync_in_progress_counts_as_a_live_controller(tmp_path: Path) -> None:
    node = Node(tmp_path / "node", deadman_s=5.0)
    node.heartbeat(age_s=3600)
    assert node.guard.due(time.time())[0] == "deadman"
    other = tmp_path / "another-node"
    other.mkdir()
    for home, counts in ((other, False), (node.home, True)):
        sync = rsync_writing_as(home)
        try:
            assert (node.guard.due(time.time()) is None) is counts
            assert node.guard.controller_alive(time.time()) is counts
        finally:
            os.killpg(sync.pid, signal.SIGKILL)
            sync.wait()


class Node:
    """A job's files on a node, in a temporary home, and the guard reading them; `lease`
    writes a lease as the controller does, signed with the key the terms name."""

    def __init__(self, home: Path, **overrides: object) -> None:
        self.home = home
        home.mkdir(parents=True, exist_ok=True)
        self.layout = GuardLayout("j-1")
        self.key = LeaseKey()
        doc = terms(lease_key=self.key.public_line, **overrides).for_node(
            now=datetime.now(UTC), hourly_usd=Decimal(1), poweroff="true", home=str(home)
        )
        self.terms = home / "terms.json"
        self.terms.write_text(doc)
        self.run_dir = home / "orch-jobs/j-1/run"
        self.run_dir.mkdir(parents=True)
        self.guard = guard.Guard(str(self.terms))

    def training(self) -> None:
        (self.run_dir / "pid").write_text(f"{os.getpid()}\n")  # a live process

    def heartbeat(self, age_s: float) -> None:
        beat = self.run_dir / "heartbeat"
        beat.touch()
        when = time.time() - age_s
        os.utime(beat, (when, when))
        self.guard.armed_at = when  # armed before that

    def lease(self, **fields: object) -> None:
        """A lease of `fields` renewed now (any `renewed_at` or `job_id` given is replaced),
        as a file written a minute ago."""
        fields = {k: v for k, v in fields.items() if k not in ("renewed_at", "job_id")}
        self.write_lease(self.key.signed("j-1", **fields))

    def write_lease(self, text: str) -> None:
        (self.home / self.layout.lease).write_text(text)
        when = time.time() - 60  # written a minute ago
        os.utime(self.home / self.layout.lease, (when, when))


def test_a_limit_is_left_to_a_live_controller_until_its_allowance_runs_out(tmp_path: Path) -> None:
    now = time.time()
    node = Node(tmp_path, runtime_deadline=datetime.fromtimestamp(now - 30, UTC))
    node.training()
    node.heartbeat(age_s=1)
    assert node.guard.due(now)[0] == "max_runtime"
    acted: list[str] = []
    node.guard.act = lambda kind, message: acted.append(kind)  # type: ignore[method-assign]
    assert not node.guard.step(now)  # the controller decides first
    assert node.guard.step(now + 100)  # ... but not forever
    node.heartbeat(age_s=20)
    assert node.guard.step(now)  # a silent controller is gone
    assert acted == ["max_runtime", "max_runtime"]


def test_the_controllers_lease_replaces_the_boot_terms(tmp_path: Path) -> None:
    now = time.time()
    node = Node(tmp_path, runtime_deadline=datetime.fromtimestamp(now - 1, UTC))
    node.training()
    node.heartbeat(age_s=30)
    node.lease(runtime_deadline=now + 3600, lease_until=now - 5)
    kind, since, _ = node.guard.due(now)
    assert (kind, since) == ("budget", now - 5)
    node.lease(runtime_deadline=now + 3600, lease_until=now + 3600)
    assert node.guard.due(now) is None


def test_limits_hold_from_the_boot_before_the_run_starts(tmp_path: Path) -> None:
    """A sync or a restore that hangs bills like a run: max_runtime and the budget lease hold
    from the node's boot, before any run has started (no pid file)."""
    now = time.time()
    node = Node(tmp_path, runtime_deadline=datetime.fromtimestamp(now - 30, UTC))
    node.heartbeat(age_s=60)
    assert not (node.run_dir / "pid").exists()
    assert node.guard.due(now)[0] == "max_runtime"
    node.lease(runtime_deadline=now + 3600, lease_until=now - 5)
    assert node.guard.due(now)[:2] == ("budget", now - 5)


def test_nothing_set_trains_on_and_the_dead_man_waits_for_the_run_to_end(tmp_path: Path) -> None:
    node = Node(tmp_path, deadman_s=5.0)
    node.training()
    node.heartbeat(age_s=3600)
    assert node.guard.due(time.time()) is None  # a run outlives its controller
    (node.run_dir / "exit_code").write_text("0\n")
    assert node.guard.due(time.time())[0] == "deadman"


def test_idle_counts_only_readings_below_the_threshold(tmp_path: Path) -> None:
    node = Node(tmp_path, idle_timeout_s=10.0)
    g = node.guard
    assert g._idle_clock(100.0, True) == 0.0
    assert g._idle_clock(105.0, None) == 5.0  # unknown keeps the clock, never starts it
    assert g._idle_clock(111.0, True) == 11.0
    assert g._idle_clock(112.0, False) == 0.0
    assert g._idle_clock(113.0, None) == 0.0


def test_the_lease_carries_what_the_guard_reads_on_the_nodes_clock() -> None:
    until = NOW + timedelta(seconds=5)
    lease = GuardLease(renewed_at=NOW, runtime_deadline=None, lease_until=until)
    assert lease.fields("j-1", clock_offset_s=-2.5) == {
        "job_id": "j-1",
        "renewed_at": NOW.timestamp() - 2.5,
        "runtime_deadline": None,
        "lease_until": NOW.timestamp() + 2.5,
    }


def test_a_node_that_shut_itself_down_without_a_word_is_put_down_to_the_limit_it_reached() -> None:
    start = NOW - timedelta(seconds=100)
    base = dict(
        at=NOW,
        started_at=start,
        max_runtime_s=None,
        spend=Decimal("1"),
        max_cost=None,
        reserve_usd=Decimal("0.1"),
        idle_timeout_s=None,
    )
    assert guard_limit_at(**{**base, "max_runtime_s": 100}) == "max_runtime"
    assert guard_limit_at(**{**base, "max_runtime_s": 101}) == "deadman"
    assert guard_limit_at(**{**base, "max_cost": Decimal("1.05")}) == "budget"
    assert guard_limit_at(**{**base, "max_cost": Decimal("2")}) == "deadman"
    assert guard_limit_at(**{**base, "max_cost": Decimal("2"), "idle_timeout_s": 60}) == "idle"
    assert guard_limit_at(**{**base, "started_at": None, "max_runtime_s": 1}) == "deadman"
