"""What a job rebuilt on a new controller host carries over from its old host's ledger.

A controller host's own ledger dies with the host; its jobs' nodes and the laptop's hand-over
kit outlive it. Each time the laptop asks the host about a job (`orch status JOB`), it keeps
beside the kit what the host's ledger said of it (`carried.json`): when the job first started,
how many recoveries it made, and every lease (ended ones included) with the price it was
launched at. The kit's record keeps the job's limits (its spec, flags applied). A rebuild
(`control.repair.rebuild`) bills from them: max_runtime counts from the job's first start, and the
spend is every lease's, not only the running nodes'.

Those figures are as fresh as the laptop's last question (`as_of`). What a rebuild can still
miss is the bill of nodes that ended after it (billed until `as_of`) or were launched and ended
after it (not billed at all); the nodes' guards still hold each node to the limits it was
launched with (`node.guard_limits`).

The host's answer is data, validated and bounded here (`from_status`): a document that does not
parse, or any field out of shape, refuses the whole of it, and the figures kept before stay.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation

from orchestrator.ledger.measures import total_cost

CARRIED = "carried.json"  # beside the job's record: ORCH_HOME/jobs/<id>/, and in its kit
MAX_LEASES = 10_000  # leases a job's figures may list
MAX_TEXT = 200  # characters of an id, a cluster or an instance type
MAX_PRICE = Decimal(100_000)  # USD per hour of one node
MAX_RECOVERIES = 100_000
MARKETS = ("spot", "on-demand")
CLOCK_SLACK = timedelta(minutes=5)  # how far the host's clock may run ahead of this machine's


@dataclass(frozen=True)
class CarriedLease:
    """One lease as the old host's ledger had it."""

    instance_id: str
    cluster: str
    rank: int
    market: str
    instance_type: str
    price_per_hour: Decimal  # recorded at launch
    launched_at: datetime
    ended_at: datetime | None  # None: billing when the figures were taken


@dataclass(frozen=True)
class Carried:
    """A job's figures as of `as_of` (this machine's clock when it kept them)."""

    as_of: datetime
    started_at: datetime | None  # the job's first start (max_runtime counts from it)
    recoveries: int
    leases: tuple[CarriedLease, ...]

    def spend(self) -> Decimal:
        """What every lease had cost at `as_of`."""
        return total_cost(self.leases, self.as_of)

    def to_json(self) -> str:
        return json.dumps(
            {
                "as_of": self.as_of.isoformat(),
                "started_at": _iso(self.started_at),
                "recoveries": self.recoveries,
                "leases": [
                    {
                        "instance_id": lease.instance_id,
                        "cluster": lease.cluster,
                        "rank": lease.rank,
                        "market": lease.market,
                        "instance_type": lease.instance_type,
                        "price_per_hour": str(lease.price_per_hour),
                        "launched_at": lease.launched_at.isoformat(),
                        "ended_at": _iso(lease.ended_at),
                    }
                    for lease in self.leases
                ],
            },
            indent=1,
        )


def from_status(document: object, *, job_id: str, as_of: datetime) -> Carried:
    """The figures in a host's `orch status JOB --json` answer for `job_id`, taken at `as_of`;
    raises ValueError, saying why, for anything out of shape (see the module docstring)."""
    doc = _object(document, "the answer")
    if doc.get("id") != job_id:
        raise ValueError(f"it is not job {job_id}'s document")
    return _figures(doc, job_id, as_of)


def from_json(text: str, job_id: str) -> Carried:
    """Figures `Carried.to_json` wrote (a kit is the laptop's, but read it as data all the
    same); raises ValueError for anything out of shape."""
    try:
        doc = _object(json.loads(text), "carried.json")
    except RecursionError as exc:
        raise ValueError("carried.json is nested too deep") from exc
    return _figures(doc, job_id, _time(doc.get("as_of"), "as_of"))


def _figures(doc: dict, job_id: str, as_of: datetime) -> Carried:
    return Carried(
        as_of=as_of,
        started_at=_maybe_time(doc.get("started_at"), "started_at", as_of),
        recoveries=_count(doc.get("recoveries", 0), "recoveries", MAX_RECOVERIES),
        leases=_leases(doc.get("leases"), job_id, as_of),
    )


def _leases(value: object, job_id: str, as_of: datetime) -> tuple[CarriedLease, ...]:
    if not isinstance(value, list):
        raise ValueError("its leases are not a list")
    if len(value) > MAX_LEASES:
        raise ValueError(f"{len(value)} leases, more than {MAX_LEASES}")
    leases = []
    for i, item in enumerate(value):
        entry = _object(item, f"lease {i}")
        launched = _time(entry.get("launched_at"), f"lease {i}'s launched_at", as_of)
        ended = _maybe_time(entry.get("ended_at"), f"lease {i}'s ended_at", as_of)
        if ended is not None and ended < launched:
            raise ValueError(f"lease {i} ended before its launch")
        market = entry.get("market")
        if market not in MARKETS:
            raise ValueError(f"lease {i}'s market is not one of {', '.join(MARKETS)}")
        leases.append(
            CarriedLease(
                instance_id=_text(entry.get("instance_id"), f"lease {i}'s instance_id"),
                cluster=_text(entry.get("cluster", job_id), f"lease {i}'s cluster"),
                rank=_count(entry.get("rank"), f"lease {i}'s rank", MAX_LEASES),
                market=str(market),
                instance_type=_text(entry.get("instance_type"), f"lease {i}'s instance_type"),
                price_per_hour=_price(entry.get("price_per_hour"), i),
                launched_at=launched,
                ended_at=ended,
            )
        )
    if len({lease.instance_id for lease in leases}) != len(leases):
        raise ValueError("a node is listed twice")
    return tuple(leases)


def _object(value: object, what: str) -> dict:
    if not isinstance(value, dict):
        raise ValueError(f"{what} is not a JSON object")
    return value


def _text(value: object, what: str) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_TEXT:
        raise ValueError(f"{what} is not a name of 1 to {MAX_TEXT} characters")
    if not value.isprintable():
        raise ValueError(f"{what} holds control characters")
    return value


def _count(value: object, what: str, most: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= most:
        raise ValueError(f"{what} is not a whole number from 0 to {most}")
    return value


def _price(value: object, i: int) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"lease {i}'s price is not a number")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"lease {i}'s price is not finite")
    try:
        price = Decimal(str(value))
    except InvalidOperation as exc:
        raise ValueError(f"lease {i}'s price is not a number") from exc
    if not price.is_finite() or not Decimal(0) <= price <= MAX_PRICE:
        raise ValueError(f"lease {i}'s price is not from 0 to {MAX_PRICE} USD per hour")
    return price


def _maybe_time(value: object, what: str, latest: datetime) -> datetime | None:
    return None if value is None else _time(value, what, latest)


def _time(value: object, what: str, latest: datetime | None = None) -> datetime:
    """A time with its zone, no later than `latest` (give or take `CLOCK_SLACK`: the host's
    clock and this machine's)."""
    if not isinstance(value, str) or len(value) > 64:
        raise ValueError(f"{what} is not a time")
    try:
        when = datetime.fromisoformat(value)
    except ValueError as exc:
        raise ValueError(f"{what} is not a time") from exc
    if when.tzinfo is None:
        raise ValueError(f"{what} has no time zone")
    if latest is not None and when > latest + CLOCK_SLACK:
        raise ValueError(f"{what} is later than the figures themselves")
    return when


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()
