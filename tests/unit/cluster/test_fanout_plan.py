"""The shape of a fan-out: the uplink's node, the order of the rest, the doubling tree."""

from __future__ import annotations

import pytest

from orchestrator.cluster.fanout_plan import (
    Meter,
    Spread,
    doubling_rounds,
    fanout_order,
    uplink_rank,
)


def test_the_uplink_goes_to_a_holder_in_the_cluster_else_the_lowest_rank() -> None:
    assert uplink_rank([0, 1, 2, 3], []) == 0
    assert uplink_rank([0, 1, 2, 3], [2, 1]) == 2
    assert uplink_rank([0, 1, 2, 3], [7, 3]) == 3  # 7 is gone
    assert uplink_rank([4, 5], [9]) == 4
    with pytest.raises(ValueError):
        uplink_rank([], [])


def test_the_other_holders_are_served_first_then_the_rest_by_rank_each_once() -> None:
    assert fanout_order([0, 1, 2, 3, 4], 2, [2, 4, 4, 9]) == [4, 0, 1, 3]
    assert fanout_order([0, 1, 2], 0, []) == [1, 2]


@pytest.mark.parametrize(
    ("count", "rounds"), [(1, 0), (2, 1), (3, 2), (4, 2), (5, 3), (8, 3), (9, 4), (64, 6)]
)
def test_the_nodes_that_hold_the_data_double_each_round(count: int, rounds: int) -> None:
    plan = doubling_rounds(0, list(range(1, count)))
    assert len(plan) == rounds
    holders = {0}
    for wave in plan:
        assert len(wave) == min(len(holders), count - len(holders))
        for source, target in wave:
            assert source in holders and target not in holders
        holders |= {target for _, target in wave}
    assert holders == set(range(count))


def test_four_nodes_take_two_rounds_of_copies() -> None:
    assert doubling_rounds(0, [1, 2, 3]) == [[(0, 1)], [(0, 2), (1, 3)]]


def test_a_copy_that_ends_early_frees_both_its_nodes_at_once() -> None:
    spread = Spread([0, 1], [2, 3, 4, 5, 6])
    assert spread.start() == [(0, 2), (1, 3)]
    assert spread.finished(1, 3) == [(1, 4), (3, 5)]  # (0, 2) still runs
    assert spread.finished(0, 2) == [(0, 6)]
    assert not spread.done
    for pair in [(1, 4), (3, 5), (0, 6)]:
        assert spread.finished(*pair) == []
    assert spread.done


def test_a_target_that_already_holds_is_not_copied_to() -> None:
    spread = Spread([0], [0, 1])
    assert spread.start() == [(0, 1)]


def test_the_meter_gives_rate_and_time_left() -> None:
    meter = Meter(total=1000, started=10.0, done=250)
    assert meter.rate(15.0) == 50.0
    assert meter.seconds_left(15.0) == 15.0
    assert Meter(total=1000, started=10.0).seconds_left(12.0) is None
    assert Meter(total=0, started=10.0).rate(10.0) == 0.0
