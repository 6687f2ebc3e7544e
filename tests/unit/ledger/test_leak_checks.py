"""The crash trials' lease check: never two leases of one rank open at once, never more than
the job's nodes, and a recovery that keeps a surviving node is not a duplicate launch."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from orchestrator.ledger.store import Lease
from tests.support.leak_checks import lease_snapshots

T0 = datetime(2026, 12, 6, tzinfo=UTC)


def lease(name: str, rank: int, start_s: float, end_s: float | None) -> Lease:
    return Lease(
        job_id="j", cluster="c", provider="local", instance_id=name, rank=rank, market="spot",
        instance_type="local", price_per_hour=Decimal("1"),
        launched_at=T0 + timedelta(seconds=start_s),
        ended_at=None if end_s is None else T0 + timedelta(seconds=end_s),
    )  # fmt: skip


def open_ranks(leases: list[Lease]) -> list[list[tuple[str, int]]]:
    now = T0 + timedelta(hours=1)
    return [[(x.instance_id, x.rank) for x in snap] for snap in lease_snapshots(leases, now)]


def test_a_survivor_beside_its_replaced_peer_is_one_rank_each_at_every_moment() -> None:
    leases = [lease("a", 0, 0, 100), lease("b", 1, 0.1, 40), lease("c", 1, 45, 100)]
    assert open_ranks(leases) == [[("a", 0)], [("a", 0), ("b", 1)], [("a", 0), ("c", 1)]]


def test_a_second_launch_of_a_rank_while_the_first_is_open_shows_both() -> None:
    leases = [lease("a", 0, 0, 100), lease("b", 1, 0, 100), lease("c", 1, 50, None)]
    assert open_ranks(leases)[-1] == [("a", 0), ("b", 1), ("c", 1)]
