"""`orch status JOB --watch` into a pipe prints a plain line for each change as it happens (the
state, step, spend, each new event), not one view at the end. The command is the real one in
its own process with stdout a pipe; the ledger is real and the test holds the controller lock."""

from __future__ import annotations

import os
import queue
import subprocess
import threading
from datetime import UTC, datetime
from pathlib import Path

from orchestrator.config import Settings
from orchestrator.control.process.controllers import ControllerLock
from orchestrator.job_state import JobState
from orchestrator.ledger.store import Job, Ledger, make_engine
from tests.support.helpers import ORCH, REPO


def next_line(lines: queue.Queue[str], timeout: float = 20.0) -> str:
    return lines.get(timeout=timeout).rstrip("\n")


def test_a_piped_watch_prints_each_change_as_it_happens(tmp_path: Path) -> None:
    home = tmp_path / "orch"
    ledger = Ledger(make_engine(home / "orch.db"))
    ledger.add_job(
        Job(
            id="j-1", name="j", provider="local", nodes=1, gpus_per_node=1, spec_json="{}",
            spec_path="job.yaml", created_at=datetime.now(UTC), state=JobState.RUNNING.value,
        )
    )  # fmt: skip
    lock = ControllerLock(Settings(home=home), "j-1")
    assert lock.acquire()  # a live controller: nothing revives the job
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    env.update({"ORCH_HOME": str(home), "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"})
    watch = subprocess.Popen(
        [*ORCH, "status", "j-1", "--watch", "--interval", "0.2"], env=env, cwd=REPO,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()
    assert watch.stdout is not None
    reader = threading.Thread(target=lambda: [lines.put(x) for x in watch.stdout], daemon=True)
    reader.start()
    try:
        assert next_line(lines) == "watching j-1 until it ends (every 0.2 s)"
        assert next_line(lines) == "j-1 RUNNING | no step yet | spend $0.0000"
        ledger.update_job("j-1", step=5, loss=0.5)
        assert next_line(lines) == "j-1 RUNNING | step 5 | loss 0.5000 | spend $0.0000"
        ledger.add_event("j-1", "CHECKPOINT", "step-000005\nsecond line", step=5)
        event = next_line(lines)
        assert event.startswith("j-1 event ") and event.endswith(" CHECKPOINT step-000005")
        ledger.update_job("j-1", state=JobState.SUCCEEDED.value, exit_code=0, reason="done")
        assert next_line(lines) == "j-1 SUCCEEDED | step 5 | loss 0.5000 | spend $0.0000 | done"
        assert watch.wait(timeout=20) == 0
        reader.join(timeout=10)  # the reader thread's last lines, up to the end of the output
        final = "\n".join(lines.get_nowait() for _ in range(lines.qsize()))
        assert "SUCCEEDED" in final and "events" in final  # the final view, once
    finally:
        watch.kill()
        lock.release()
