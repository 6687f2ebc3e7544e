"""A job for the deadline-aware spot policies' live tests: a plain script (no torch) whose
steps take `STEP_S` each, printing `step` and `total_steps`, checkpointing every 4 steps in the
orch trainer layout (`step-NNNNNN/`), resuming from `ORCH_RESUME_FROM`, and stopping with a
checkpoint on SIGTERM (exit 143)."""

from __future__ import annotations

from pathlib import Path

STEP_S = 0.25  # wall seconds per training step of the job

TRAIN = """\
import json, os, signal, sys, time
from pathlib import Path

total = int(os.environ["TOTAL_STEPS"])
step_s = float(os.environ["STEP_S"])
ckpt = Path(os.environ["ORCH_CHECKPOINT_DIR"])
resume = os.environ.get("ORCH_RESUME_FROM", "")
step = int((Path(resume) / "step").read_text()) if resume else 0
stop = False


def on_term(signum, frame):
    global stop
    stop = True


signal.signal(signal.SIGTERM, on_term)


def save(step):
    final = ckpt / f"step-{step:06d}"
    if final.exists():
        return
    tmp = ckpt / f".tmp-step-{step:06d}"
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "step").write_text(str(step))
    (tmp / "COMPLETE").write_text("")
    os.rename(tmp, final)
    for old in sorted(ckpt.glob("step-*"))[:-3]:
        for f in old.iterdir():
            f.unlink()
        old.rmdir()


while step < total and not stop:
    time.sleep(step_s)
    step += 1
    print(json.dumps({"step": step, "total_steps": total, "t": time.time(), "run": os.getpid()}),
          flush=True)
    if step % 4 == 0:
        save(step)
save(step)
if stop and step < total:
    print(json.dumps({"event": "stopped", "step": step}), flush=True)
    sys.exit(143)
print(json.dumps({"event": "done", "step": step}), flush=True)
"""


def write_job(tmp_path: Path, name: str, steps: int, extra: str = "") -> Path:
    """The spec of job `name`, `steps` steps on one node (`--nodes` changes that), its script
    under `tmp_path/work`; `extra` is appended to the spec (a deadline, a policy)."""
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    (work / "train.py").write_text(TRAIN)
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(
        f"name: {name}\nworkdir: work\nrun: python train.py\n"
        "resources: {nodes: 1, gpus_per_node: 1}\n"
        "checkpoint: {pull_every: 1}\n"
        f"env: {{TOTAL_STEPS: '{steps}', STEP_S: '{STEP_S}'}}\n" + extra
    )
    return spec
