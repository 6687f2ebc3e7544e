"""The reference trainer end to end: real processes, torchrun --standalone, gloo on the CPU.

Every run uses the tiny model on a small fake data set, no DataLoader workers and one thread
per process, so the whole file takes a few minutes on two cores. Parameters are compared by
reading the checkpoints the runs write (state.pt, the documented format).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from orch_trainer.models import build_model

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
TINY = ["--model", "tiny", "--workers", "0", "--checkpoint-seconds", "0", "--log-every", "1"]
EXIT_LINE = re.compile(r"^trainer rank=(\d+) exit=(\d+) step=(\d+)$", re.MULTILINE)


def flags(text: str) -> list[str]:
    return text.split()


def trainer_env(**extra: str) -> dict[str, str]:
    """The parent's environment minus torchrun/orch variables, one thread, loopback gloo."""
    drop = ("ORCH_", "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_", "TORCHELASTIC_", "GROUP_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(
        {
            "OMP_NUM_THREADS": "1",
            "GLOO_SOCKET_IFNAME": "lo",
            "PYTHONPATH": str(REPO),
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(extra)
    return env


def command(args: list[str], nproc: int | None) -> list[str]:
    """`python -m orch_trainer.train ARGS`, under torchrun with `nproc` processes unless None."""
    if nproc is None:
        return [sys.executable, "-m", "orch_trainer.train", *args]
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    return [*launcher, f"--nproc-per-node={nproc}", "-m", "orch_trainer.train", *args]


def run(
    args: list[str], *, nproc: int | None = None, timeout: float = 120, **env: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command(args, nproc),
        env=trainer_env(**env),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def records(stdout: str) -> list[dict[str, Any]]:
    """Rank 0's JSON lines."""
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def progress(stdout: str) -> list[dict[str, Any]]:
    return [r for r in records(stdout) if "event" not in r]


def event(stdout: str, name: str) -> list[dict[str, Any]]:
    return [r for r in records(stdout) if r.get("event") == name]


def exits(stdout: str) -> dict[int, tuple[int, int]]:
    """rank -> (exit code, step) from the `trainer rank=R exit=C step=N` lines."""
    return {int(r): (int(c), int(s)) for r, c, s in EXIT_LINE.findall(stdout)}


def saved(directory: Path, step: int) -> dict[str, Any]:
    path = directory / f"step-{step:06d}"
    assert (path / "COMPLETE").is_file(), f"{path} is not complete"
    return torch.load(path / "state.pt", map_location="cpu", weights_only=True)


def assert_ok(result: subprocess.CompletedProcess[str], code: int = 0) -> None:
    assert result.returncode == code, (
        f"exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    )


def assert_models_close(a: dict[str, Any], b: dict[str, Any], atol: float) -> None:
    assert a["model"].keys() == b["model"].keys()
    for key in a["model"]:
        assert torch.allclose(a["model"][key], b["model"][key], rtol=0, atol=atol), key


# --- equivalences -----------------------------------------------------------------------

EQUIV = [*TINY, "--fake-size", "72", "--steps", "6", "--seed", "3"]  # 72 = 4.5 steps of 16


@pytest.fixture(scope="module")
def one_rank_batch16(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    directory = tmp_path_factory.mktemp("b16")
    result = run([*EQUIV, "--batch-size", "16", "--checkpoint-dir", str(directory)])
    assert_ok(result)
    assert event(result.stdout, "done") == [{"event": "done", "step": 6}]
    return saved(directory, 6)


def test_two_ranks_of_8_equal_one_rank_of_16(
    one_rank_batch16: dict[str, Any], tmp_path: Path
) -> None:
    result = run([*EQUIV, "--batch-size", "8", "--checkpoint-dir", str(tmp_path)], nproc=2)
    assert_ok(result)
    ddp = saved(tmp_path, 6)
    assert ddp["meta"]["world_size"] == 2 and ddp["meta"]["global_batch"] == 16
    assert_models_close(ddp, one_rank_batch16, atol=1e-6)
    torch.manual_seed(3)
    initial = build_model("tiny", 10).state_dict()
    moved = max((initial[k] - ddp["model"][k]).abs().max().item() for k in initial)
    assert moved > 1e-3  # the runs trained; equality is not that of two untouched models


def test_batch_8_with_accumulation_2_equals_batch_16(
    one_rank_batch16: dict[str, Any], tmp_path: Path
) -> None:
    args = [*EQUIV, "--batch-size", "8", "--accum", "2", "--checkpoint-dir", str(tmp_path)]
    result = run(args)
    assert_ok(result)
    assert_models_close(saved(tmp_path, 6), one_rank_batch16, atol=1e-6)


def test_resume_gives_the_same_parameters_as_a_straight_run(tmp_path: Path) -> None:
    # 88 samples = 5.5 steps of 16 per epoch: the stop at step 10 is in the middle of epoch 1
    common = [*TINY, *flags("--fake-size 88 --batch-size 8 --steps 20 --warmup-steps 3")]
    common += flags("--seed 5 --deterministic")
    straight_dir, split_dir = tmp_path / "straight", tmp_path / "split"
    straight = run([*common, "--checkpoint-dir", str(straight_dir)], nproc=2)
    assert_ok(straight)
    first = run([*common, "--checkpoint-dir", str(split_dir), "--stop-after", "10"], nproc=2)
    assert_ok(first, 1)  # torchrun reports failed workers with 1
    assert exits(first.stdout) == {0: (143, 10), 1: (143, 10)}
    assert (split_dir / "latest").read_text() == "step-000010\n"
    assert saved(split_dir, 10)["progress"] == {"epoch": 1, "epoch_samples": 64, "step": 10}
    second = run([*common, "--checkpoint-dir", str(split_dir)], nproc=2)
    assert_ok(second)
    assert event(second.stdout, "resume")[0]["step"] == 10
    assert [p["step"] for p in progress(second.stdout)] == list(range(11, 21))
    # same losses and rates step by step, and bit-identical final parameters and momenta
    straight_tail = [p for p in progress(straight.stdout) if p["step"] > 10]
    for a, b in zip(straight_tail, progress(second.stdout), strict=True):
        assert (a["loss"], a["lr"], a["epoch"]) == (b["loss"], b["lr"], b["epoch"])
    ours, theirs = saved(split_dir, 20), saved(straight_dir, 20)
    for key in theirs["model"]:
        assert torch.equal(ours["model"][key], theirs["model"][key]), key
    for idx, buf in theirs["optimizer"]["state"].items():
        assert torch.equal(
            ours["optimizer"]["state"][idx]["momentum_buffer"], buf["momentum_buffer"]
        )
    halfway = saved(split_dir, 10)["model"]
    assert not all(torch.equal(halfway[k], theirs["model"][k]) for k in halfway)


# --- stopping on a signal ---------------------------------------------------------------

SMALL = [*TINY, *flags("--fake-size 400 --batch-size 8")]
LONG_RUN = [*SMALL, "--steps", "100000"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch_ranks(args: list[str], world: int, **extra: str) -> list[subprocess.Popen[str]]:
    """`world` trainer processes wired by hand (no torchrun), so each one can be signalled."""
    port = str(_free_port())
    procs = []
    for rank in range(world):
        env = trainer_env(
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(world),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port,
            **extra,
        )
        procs.append(
            subprocess.Popen(
                command(args, None),
                env=env,
                cwd=REPO,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                stdin=subprocess.DEVNULL,
            )
        )
    return procs


def read_until_step(proc: subprocess.Popen[str], step: int) -> list[str]:
    """`proc`'s stdout lines up to its first progress line at `step` or later."""
    lines: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if line.startswith('{"step"') and json.loads(line)["step"] >= step:
            return lines
    raise AssertionError(f"trainer ended before step {step}:\n" + "".join(lines))


def kill_all(procs: list[subprocess.Popen[str]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_sigterm_to_torchrun_stops_every_rank_at_one_step_and_resumes_there(
    tmp_path: Path,
) -> None:
    ckpt = tmp_path / "ckpt"
    args = [*LONG_RUN, "--checkpoint-dir", str(ckpt)]
    with open(tmp_path / "stderr", "w") as err:
        proc = subprocess.Popen(
            command(args, 2),
            env=trainer_env(),
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            stdin=subprocess.DEVNULL,
        )
        try:
            lines = read_until_step(proc, 5)
            seen_step = json.loads(lines[-1])["step"]
            signalled = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            rest, _ = proc.communicate(timeout=60)
            elapsed = time.monotonic() - signalled
        finally:
            kill_all([proc])
    stdout = "".join(lines) + rest
    assert proc.returncode != 0  # torchrun itself was terminated
    assert "trainer rank=0 world_size=2 local_rank=0" in stdout
    assert "trainer rank=1 world_size=2 local_rank=1" in stdout
    codes = exits(stdout)
    assert sorted(codes) == [0, 1], stdout[-2000:]
    (code0, stop_step), (code1, step1) = codes[0], codes[1]
    assert code0 == code1 == 143 and stop_step == step1
    assert stop_step >= seen_step
    assert elapsed < 30, f"took {elapsed:.1f}s to stop"
    assert event(stdout, "stopped")[0] == {
        "event": "stopped",
        "step": stop_step,
        "signal": "SIGTERM",
    }
    assert event(stdout, "checkpoint")[-1]["step"] == stop_step
    assert (ckpt / "latest").read_text() == f"step-{stop_step:06d}\n"
    assert saved(ckpt, stop_step)["progress"]["step"] == stop_step
    assert not [p for p in ckpt.iterdir() if p.name.startswith(".tmp-")]

    resumed = run([*SMALL, "--steps", str(stop_step + 3), "--checkpoint-dir", str(ckpt)], nproc=2)
    assert_ok(resumed)
    assert event(resumed.stdout, "resume")[0] == {
        "event": "resume",
        "step": stop_step,
        "path": str(ckpt / f"step-{stop_step:06d}"),
    }
    assert [p["step"] for p in progress(resumed.stdout)] == [stop_step + i for i in (1, 2, 3)]
    assert event(resumed.stdout, "done") == [{"event": "done", "step": stop_step + 3}]
    assert exits(resumed.stdout) == {0: (0, stop_step + 3), 1: (0, stop_step + 3)}


def test_sigusr1_to_one_rank_stops_both_with_exit_143(tmp_path: Path) -> None:
    """Without torchrun in between, the ranks' own exit statuses are visible."""
    ckpt = tmp_path / "ckpt"
    procs = launch_ranks(LONG_RUN, 2, ORCH_CHECKPOINT_DIR=str(ckpt))
    try:
        lines = read_until_step(procs[0], 3)
        procs[1].send_signal(signal.SIGUSR1)  # only rank 1 is told
        out0 = "".join(lines) + procs[0].communicate(timeout=60)[0]
        out1 = procs[1].communicate(timeout=60)[0]
    finally:
        kill_all(procs)
    assert [p.returncode for p in procs] == [143, 143], out0[-2000:]
    (_, step0), (_, step1) = exits(out0)[0], exits(out1)[1]
    assert step0 == step1
    assert event(out0, "stopped")[0]["signal"] == "peer"  # rank 0 heard it from rank 1
    assert saved(ckpt, step0)["progress"]["step"] == step0


def test_a_hung_peer_fails_the_job_after_the_timeout(tmp_path: Path) -> None:
    procs = launch_ranks([*LONG_RUN, "--timeout", "3"], 2)
    try:
        read_until_step(procs[0], 3)
        procs[1].send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        procs[0].communicate(timeout=60)
        waited = time.monotonic() - stopped
    finally:
        kill_all(procs)
    assert procs[0].returncode == 1
    assert waited < 30, f"rank 0 waited {waited:.1f}s for a frozen peer"


# --- resuming: incomplete checkpoints, other world sizes --------------------------------


# `make test` keeps test_trainer_checkpoint's incomplete and temporary directories
@pytest.mark.soak
def test_half_written_checkpoints_are_never_resumed(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    args = [*TINY, "--fake-size", "64", "--batch-size", "8"]
    first = run([*args, "--steps", "4", "--checkpoint-every", "2"], ORCH_CHECKPOINT_DIR=str(ckpt))
    assert_ok(first)
    assert [c["step"] for c in event(first.stdout, "checkpoint")] == [2, 4]
    # a crash while saving leaves a temp dir, or a dir whose marker was never written
    shutil.copytree(ckpt / "step-000004", ckpt / ".tmp-step-000008-999999")
    shutil.copytree(ckpt / "step-000004", ckpt / "step-000006")
    (ckpt / "step-000006" / "COMPLETE").unlink()

    refused = run(
        [*args, "--steps", "9"],
        ORCH_CHECKPOINT_DIR=str(ckpt),
        ORCH_RESUME_FROM=str(ckpt / "step-000006"),
    )
    assert_ok(refused, 2)
    assert refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr
    assert "not a complete checkpoint" in refused.stderr

    resumed = run([*args, "--steps", "6"], ORCH_CHECKPOINT_DIR=str(ckpt), ORCH_RESUME_FROM="")
    assert_ok(resumed)
    assert event(resumed.stdout, "resume")[0]["step"] == 4
    assert [p["step"] for p in progress(resumed.stdout)] == [5, 6]
    assert saved(ckpt, 6)["progress"]["step"] == 6  # the final save replaced the half one
    assert not (ckpt / ".tmp-step-000008-999999").exists()  # stale temp dir cleaned up


def _consumed(prefix: Path) -> list[int]:
    found = []
    for path in sorted(prefix.parent.glob(f"{prefix.name}.rank*.jsonl")):
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            assert entry["epoch"] == 0
            found.extend(entry["indices"])
    return found


# `make test` keeps test_trainer_sampler's world-size change mid-epoch
@pytest.mark.soak
def test_world_size_change_sees_every_sample_once(tmp_path: Path) -> None:
    # 98 samples: 2 ranks x 8 stop after 3 steps (48 consumed); 50 remain, which 3 ranks x 8
    # take as 24 + 24 + 2 (the last micro-step leaves rank 2 empty), 1 rank x 8 as 6x8 + 2
    common = [*TINY, "--fake-size", "98", "--batch-size", "8", "--epochs", "1", "--seed", "11"]
    first_prefix = tmp_path / "first" / "samples"
    stop = ["--stop-after", "3", "--record-samples", str(first_prefix)]
    first = run([*common, *stop, "--checkpoint-dir", str(tmp_path / "c2")], nproc=2)
    assert_ok(first, 1)
    assert exits(first.stdout) == {0: (143, 3), 1: (143, 3)}
    before = _consumed(first_prefix)
    assert len(before) == 48 == len(set(before))
    checkpoint = tmp_path / "c2" / "step-000003"

    for nproc, world, final_step in ((None, 1, 3 + 7), (3, 3, 3 + 3)):
        prefix = tmp_path / f"w{world}" / "samples"
        resume = ["--resume", str(checkpoint), "--record-samples", str(prefix)]
        result = run(
            [*common, *resume, "--checkpoint-dir", str(tmp_path / f"c{world}")], nproc=nproc
        )
        assert_ok(result)
        assert event(result.stdout, "done") == [{"event": "done", "step": final_step}]
        after = _consumed(prefix)
        assert len(list(prefix.parent.glob("samples.rank*.jsonl"))) == world
        assert Counter(before + after) == Counter(range(98)), f"world size {world}"
        assert saved(tmp_path / f"c{world}", final_step)["progress"] == {
            "epoch": 1,
            "epoch_samples": 0,
            "step": final_step,
        }


# --- bad input ----------------------------------------------------------------------------


def test_bad_input_is_one_line_and_exit_2_from_a_real_process() -> None:
    """Every case runs in-process in tests/unit/trainer/test_trainer_usage.py; this is the process's
    own exit status and stderr."""
    result = run([*TINY, "--fake-size", "8", "--steps", "1", "--no-such-flag"], timeout=60)
    assert_ok(result, 2)
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("trainer: error: unrecognized arguments"), result.stderr
    assert not progress(result.stdout)
