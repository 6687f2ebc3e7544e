"""The guard is a supervised daemon: a pass that raises is logged and counted, and the next
pass still acts. The guard runs as a process, from its file as on a node, in a temporary home."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

from orchestrator.node import guard
from orchestrator.node.guard_protocol import GuardLayout, GuardTerms
from tests.support.waiting import wait_until

LIMIT_S = 3.0  # max_runtime from the guard's start

# The guard's own program, whose look at the run's progress always raises (the fault a pass
# may meet): max_runtime, which the guard checks before it, still ends the run.
FAILING_PROGRESS = f"""
import sys
sys.path.insert(0, {str(Path(guard.__file__).parent)!r})
import guard
def progress_due(self, *args):
    raise ValueError("the run's progress could not be read")
guard.Guard.progress_due = progress_due
guard.main(["guard.py", sys.argv[1]])
"""


def test_a_pass_that_raises_does_not_end_the_guard_and_a_later_pass_acts(tmp_path: Path) -> None:
    home = tmp_path / "home"
    layout = GuardLayout("j-1")
    (home / layout.root).mkdir(parents=True)
    run = home / "orch-jobs/j-1/run"
    run.mkdir()
    (run / "launch.sh").write_text("export ORCH_NODE_RANK=0\ntorchrun x\n")
    powered_off = tmp_path / "powered-off"
    now = datetime.now(UTC)
    terms = GuardTerms(
        job_id="j-1", interval_s=0.2, silence_s=1.0, allowance_s=600.0, deadman_s=None,
        stop_grace_s=1.0, upload_wait_s=0.0, idle_util_pct=5.0, idle_cpu_pct=10.0,
        runtime_deadline=now + timedelta(seconds=LIMIT_S), start_timeout_s=600.0,
    )  # fmt: skip
    (home / layout.terms).write_text(
        terms.for_node(
            now=now, hourly_usd=Decimal(1), poweroff=f"touch {powered_off}", home=str(home)
        )
    )
    log = tmp_path / "guard.log"
    with log.open("wb") as out:
        daemon = subprocess.Popen(
            [sys.executable, "-c", FAILING_PROGRESS, str(home / layout.terms)],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        wait_until(
            lambda: powered_off.exists() or daemon.poll() is not None, "the guard's poweroff", 30,
            interval=0.05,
        )  # fmt: skip
        text = log.read_text()
        assert daemon.poll() is None, f"the guard ended: {text[-2000:]}"
        assert powered_off.exists()
    finally:
        daemon.send_signal(signal.SIGKILL)
        daemon.wait(timeout=10)
    assert text.count("Traceback") == 1 and "ValueError" in text  # logged once, not per pass
    decision = json.loads((home / layout.decision).read_text())
    assert decision["kind"] == "max_runtime"
    status = json.loads((home / layout.status).read_text())
    limits = status["events"]["limits"]
    assert limits["failures"] >= 2 and "ValueError" in limits["last_error"]
    assert status["acting"]["kind"] == "max_runtime" and status["problem"] is None
    assert status["events"]["notices"]["failures"] == 0
