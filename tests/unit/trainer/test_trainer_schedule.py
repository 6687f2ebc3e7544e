"""Learning-rate scaling, warmup and cosine decay."""

from __future__ import annotations

import math

import pytest
import torch

from orch_trainer.schedule import WarmupCosine, default_warmup, lr_factor, scaled_lr


def test_linear_scaling_against_a_batch_of_256() -> None:
    assert scaled_lr(0.1, 256) == pytest.approx(0.1)
    assert scaled_lr(0.1, 1024) == pytest.approx(0.4)
    assert scaled_lr(0.2, 32) == pytest.approx(0.025)


def test_warmup_rises_linearly_to_the_peak() -> None:
    factors = [lr_factor(s, warmup_steps=4, total_steps=20) for s in range(4)]
    assert factors == pytest.approx([0.25, 0.5, 0.75, 1.0])


def test_cosine_decays_from_peak_to_zero() -> None:
    total, warmup = 21, 1
    factors = [lr_factor(s, warmup_steps=warmup, total_steps=total) for s in range(total + 1)]
    assert factors[1] == pytest.approx(1.0)
    assert factors[11] == pytest.approx(0.5)
    assert factors[total] == pytest.approx(0.0, abs=1e-12)
    after_warmup = factors[1:]
    assert all(a > b for a, b in zip(after_warmup, after_warmup[1:], strict=False))
    assert factors[5] == pytest.approx(0.5 * (1 + math.cos(math.pi * 4 / 20)))


def test_no_warmup_starts_at_the_peak_and_steps_past_the_end_stay_at_zero() -> None:
    assert lr_factor(0, warmup_steps=0, total_steps=10) == pytest.approx(1.0)
    assert lr_factor(50, warmup_steps=0, total_steps=10) == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError):
        lr_factor(-1, warmup_steps=0, total_steps=10)


def test_default_warmup_is_five_percent() -> None:
    assert default_warmup(1000) == 50
    assert default_warmup(10) == 0


def test_scheduler_drives_the_optimizer_and_resumes_from_its_state() -> None:
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=123.0)
    sched = WarmupCosine(opt, peak_lr=0.8, warmup_steps=2, total_steps=10)
    seen = []
    for _ in range(5):
        seen.append(opt.param_groups[0]["lr"])
        sched.step()
    expected = [0.8 * lr_factor(s, warmup_steps=2, total_steps=10) for s in range(5)]
    assert seen == pytest.approx(expected)

    opt2 = torch.optim.SGD([param], lr=1.0)
    again = WarmupCosine(opt2, peak_lr=0.8, warmup_steps=2, total_steps=10)
    again.load_state_dict(sched.state_dict())
    assert opt2.param_groups[0]["lr"] == pytest.approx(
        0.8 * lr_factor(5, warmup_steps=2, total_steps=10)
    )
    assert again.lr == sched.lr
