"""Node directories a killed launcher left without a record are removed, never a live launch's."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from orchestrator.providers.local.state import NodeRecord, NodeStore
from tests.support.helpers import REPO

# A launcher that makes a node directory under `making()` and is killed before the record.
LAUNCHER = """
import sys, time
from pathlib import Path
from orchestrator.providers.local.state import NodeStore
store = NodeStore(Path(sys.argv[1]))
with store.making():
    store.create_dir("l-00000000aa")
    (store.node_dir("l-00000000aa") / "ssh_host_ed25519_key").write_text("secret")
    print("made", flush=True)
    time.sleep(60)
"""


def record(instance_id: str) -> NodeRecord:
    return NodeRecord(
        instance_id=instance_id, job_id="j", cluster="j", rank=0, mode="loopback",
        ip="127.0.0.1", port=1, interface="lo", ssh_user="root", home="/tmp",
        host_key="ssh-ed25519 AAAA", market="spot", instance_type="local-1x",
        price_per_hour="0", launched_at="2026-01-01T00:00:00+00:00",
    )  # fmt: skip


def test_a_killed_launchers_half_made_node_is_reaped_and_a_live_ones_is_not(
    tmp_path: Path,
) -> None:
    store = NodeStore(tmp_path / "local")
    store.create_dir("l-00000000bb")
    store.save(record("l-00000000bb"))  # a recorded node: never reaped
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(store.root)], cwd=REPO, text=True,
        stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert launcher.stdout is not None and launcher.stdout.readline().strip() == "made"
        assert store.reap_unrecorded() == []  # the launch is under way
        assert store.node_dir("l-00000000aa").exists()
    finally:
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
    assert store.reap_unrecorded() == ["l-00000000aa"]
    assert not store.node_dir("l-00000000aa").exists()
    assert [r.instance_id for r in store.all()] == ["l-00000000bb"]
    assert store.reap_unrecorded() == []


def test_launches_side_by_side_do_not_wait_for_each_other(tmp_path: Path) -> None:
    store = NodeStore(tmp_path / "local")
    started = time.monotonic()
    with store.making(), store.making():
        assert store.reap_unrecorded() == []
    assert time.monotonic() - started < 10.0  # a wait would hang: no speed target
