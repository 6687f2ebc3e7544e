"""The resumable sampler: every sample once per epoch, at any world size, from any step."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orch_trainer.sampler import (
    ResumableBatchSampler,
    StepPlan,
    epoch_permutation,
    plan_steps,
    plan_total_steps,
    steps_remaining,
)
from tests.support.fuzzing import examples


def _all_ranks(
    order: list[int], start: int, world: int, batch: int, accum: int
) -> list[list[StepPlan]]:
    return [
        list(
            plan_steps(order, start=start, rank=r, world_size=world, batch_size=batch, accum=accum)
        )
        for r in range(world)
    ]


def test_permutation_is_deterministic_and_changes_with_epoch_and_seed() -> None:
    first = epoch_permutation(50, seed=3, epoch=0)
    assert sorted(first) == list(range(50))
    assert first == epoch_permutation(50, seed=3, epoch=0)
    assert first != epoch_permutation(50, seed=3, epoch=1)
    assert first != epoch_permutation(50, seed=4, epoch=0)


@settings(max_examples=examples(150), deadline=None)
@given(
    n=st.integers(1, 120),
    world=st.integers(1, 5),
    batch=st.integers(1, 9),
    accum=st.integers(1, 3),
    start_frac=st.floats(0, 1),
)
def test_ranks_cover_the_rest_of_the_epoch_exactly_once(
    n: int, world: int, batch: int, accum: int, start_frac: float
) -> None:
    order = epoch_permutation(n, seed=0, epoch=0)
    start = int(start_frac * n)
    per_rank = _all_ranks(order, start, world, batch, accum)
    # the same number of steps and micro-steps everywhere, or DDP would hang
    shapes = {tuple(len(s.micro_batches) for s in steps) for steps in per_rank}
    assert len(shapes) == 1
    # all ranks agree on each step's global size, which sums to what is left
    sizes = {tuple(s.global_samples for s in steps) for steps in per_rank}
    assert len(sizes) == 1
    assert sum(next(iter(sizes))) == n - start
    seen = Counter(i for steps in per_rank for s in steps for i in s.indices)
    assert seen == Counter(order[start:])
    global_batch = batch * world * accum
    assert len(per_rank[0]) == steps_remaining(n, start, global_batch)


@settings(max_examples=examples(100), deadline=None)
@given(
    n=st.integers(10, 150),
    before=st.tuples(st.integers(1, 4), st.integers(1, 6), st.integers(1, 2)),
    after=st.tuples(st.integers(1, 4), st.integers(1, 6), st.integers(1, 2)),
    stop_at=st.integers(0, 8),
)
def test_world_size_change_mid_epoch_neither_repeats_nor_skips(
    n: int, before: tuple[int, int, int], after: tuple[int, int, int], stop_at: int
) -> None:
    order = epoch_permutation(n, seed=7, epoch=2)
    world, batch, accum = before
    done = _all_ranks(order, 0, world, batch, accum)
    steps_taken = min(stop_at, len(done[0]))
    consumed = [i for steps in done for s in steps[:steps_taken] for i in s.indices]
    position = sum(s.global_samples for s in done[0][:steps_taken])
    # what was consumed is exactly the prefix the checkpoint's position describes
    assert sorted(consumed) == sorted(order[:position])
    world2, batch2, accum2 = after
    rest = [
        i
        for steps in _all_ranks(order, position, world2, batch2, accum2)
        for s in steps
        for i in s.indices
    ]
    assert Counter(consumed + rest) == Counter(range(n))


def test_tail_smaller_than_world_gives_empty_micro_batches_to_some_ranks() -> None:
    order = list(range(50))
    per_rank = _all_ranks(order, start=0, world=3, batch=8, accum=1)
    last = [steps[-1] for steps in per_rank]
    assert [s.global_samples for s in last] == [2, 2, 2]
    assert [len(s.micro_batches[0]) for s in last] == [1, 1, 0]
    assert last[0].micro_batches[0] == (48,) and last[1].micro_batches[0] == (49,)


def test_micro_steps_deal_round_robin_within_a_step() -> None:
    order = list(range(100, 132))
    steps = list(plan_steps(order, start=0, rank=1, world_size=2, batch_size=4, accum=2))
    assert steps[0].micro_batches == ((101, 103, 105, 107), (109, 111, 113, 115))
    assert steps[0].global_samples == 16
    assert len(steps) == 2


def test_plan_rejects_bad_rank_and_position() -> None:
    with pytest.raises(ValueError):
        next(plan_steps([0, 1], start=0, rank=2, world_size=2, batch_size=1, accum=1))
    with pytest.raises(ValueError):
        next(plan_steps([0, 1], start=3, rank=0, world_size=1, batch_size=1, accum=1))


def test_batch_sampler_iterates_the_planned_micro_batches() -> None:
    sampler = ResumableBatchSampler(37, seed=1, rank=1, world_size=2, batch_size=3, accum=2)
    sampler.set_epoch(4, start=5)
    planned = [list(m) for s in sampler.steps() for m in s.micro_batches]
    assert list(sampler) == planned
    assert len(sampler) == len(planned)
    order = epoch_permutation(37, seed=1, epoch=4)
    assert planned[0] == [order[6], order[8], order[10]]
    with pytest.raises(ValueError):
        sampler.set_epoch(0, start=38)


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"epochs": None, "steps": 7}, 7),  # --steps alone wins whatever the epochs hold
        ({"epochs": None, "steps": None}, 4),  # one epoch of ceil(50 / 16) steps
        ({"epochs": 3, "steps": None}, 12),
        ({"epochs": 3, "steps": 5}, 5),  # both: whichever first
        ({"epochs": 1, "steps": 100}, 4),
    ],
)
def test_total_steps_from_the_start(kwargs: dict[str, int | None], expected: int) -> None:
    total = plan_total_steps(
        step=0, epoch=0, epoch_samples=0, num_samples=50, global_batch=16, **kwargs
    )
    assert total == expected


def test_total_steps_after_a_resume_with_another_global_batch() -> None:
    # 3 steps of 16 done (48 of 50 samples); the rest of epoch 0 is one step, epoch 1 two of 32
    total = plan_total_steps(
        step=3, epoch=0, epoch_samples=48, num_samples=50, global_batch=32, epochs=2, steps=None
    )
    assert total == 3 + 1 + 2
    done = plan_total_steps(
        step=9, epoch=2, epoch_samples=0, num_samples=50, global_batch=32, epochs=2, steps=None
    )
    assert done == 9
