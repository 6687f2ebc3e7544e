"""The trainer-contract script of docs/spot.md, run as documented under torchrun (2 ranks,
gloo): SIGTERM to the whole run -> both ranks stop after the same step, rank 0 leaves a
complete `step-N` directory and `latest`, and a second run resumes from ORCH_RESUME_FROM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.doc_blocks import REPO, blocks, covered_by

pytestmark = pytest.mark.e2e

THIS = "tests/e2e/test_docs_contract.py::test_the_documented_script_follows_the_contract"


def torchrun(script: Path, steps: int, env: dict[str, str], stderr: Path) -> subprocess.Popen[str]:
    with stderr.open("w") as err:  # read back in failure messages
        return subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
             str(script), str(steps)],
            env=env, cwd=script.parent, text=True, stdout=subprocess.PIPE,
            stderr=err, stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip


def test_the_documented_script_follows_the_contract(tmp_path: Path) -> None:
    [example] = [b for b in blocks(REPO / "docs" / "spot.md") if THIS in covered_by(b.arg)]
    assert example.lang == "python"
    script = tmp_path / "train.py"
    script.write_text(example.text + "\n")
    ckpt = tmp_path / "ckpt"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    env.update(ORCH_CHECKPOINT_DIR=str(ckpt), ORCH_RESUME_FROM="", OMP_NUM_THREADS="1")

    first_err, resumed_err = tmp_path / "first.err", tmp_path / "resumed.err"
    run = torchrun(script, 1_000_000, env, first_err)
    lines: list[str] = []
    try:
        assert run.stdout is not None
        for line in run.stdout:
            lines.append(line)
            if line.startswith('{"step"') and json.loads(line)["step"] >= 5:
                break
        else:
            raise AssertionError(
                "the script ended before step 5:\n" + "".join(lines) + first_err.read_text()
            )
        os.killpg(run.pid, signal.SIGTERM)  # what orch does: SIGTERM to the run's session
        signalled = time.monotonic()
        rest, _ = run.communicate(timeout=90)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    assert time.monotonic() - signalled < 60
    stopped = sorted(line for line in rest.splitlines() if " stopped at step " in line)
    assert [line.split()[1] for line in stopped] == ["0", "1"], (
        "".join(lines) + rest + first_err.read_text()
    )
    step = int(stopped[0].split()[-1])
    assert stopped[1].endswith(f"step {step}")  # both ranks stopped after the same step
    name = f"step-{step:06d}"
    assert (ckpt / "latest").read_text() == f"{name}\n"
    assert (ckpt / name / "COMPLETE").is_file() and (ckpt / name / "state.pt").is_file()
    assert not [p for p in ckpt.iterdir() if p.name.startswith(".tmp")]

    env["ORCH_RESUME_FROM"] = str(ckpt / name)
    resumed = torchrun(script, step + 3, env, resumed_err)
    out, _ = resumed.communicate(timeout=180)
    assert resumed.returncode == 0, out + resumed_err.read_text()
    printed = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert printed[0] == {"event": "resume", "step": step}
    assert [p["step"] for p in printed[1:]] == [step + 1, step + 2, step + 3]
    assert f"rank 0 done at step {step + 3}" in out and f"rank 1 done at step {step + 3}" in out
    assert (ckpt / "latest").read_text() == f"step-{step + 3:06d}\n"
