"""The controller host's own line of the bill, kept in this ORCH_HOME's ledger
(`ledger.host_leases`): opened when `orch controller up` launched a host, closed when its
billing stopped (`down` terminated it, `up` ended it as dead, or its autostop powered it off).

The host wing acts on hosts and knows no ledger; these are the commands' steps that write its
lease, around what the host wing did.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.cli.context import load_settings, open_ledger

if TYPE_CHECKING:
    from orchestrator.config import Settings
    from orchestrator.host.record import HostRecord


def open_lease(settings: Settings, record: HostRecord) -> None:
    """A launched host bills from its launch (its record says when, and at what price)."""
    from decimal import Decimal

    from orchestrator.ledger.host_leases import HostLeases
    from orchestrator.ledger.store import HostLease

    if record.instance_id is None or record.price_per_hour is None or not record.launched_at:
        return
    HostLeases(open_ledger(settings)).open(
        HostLease(
            instance_id=record.instance_id,
            provider=record.provider or "local",
            host=f"{record.user}@{record.host}:{record.port}",
            price_per_hour=Decimal(record.price_per_hour),
            launched_at=datetime.fromisoformat(record.launched_at),
        )
    )


def close_lease(settings: Settings, instance_id: str | None, at: str | datetime | None) -> None:
    """The host's billing stopped at `at` (an ISO time or a datetime; None: nothing to do)."""
    from orchestrator.ledger.host_leases import HostLeases

    if instance_id is None or at is None:
        return
    ended = at if isinstance(at, datetime) else datetime.fromisoformat(at)
    HostLeases(open_ledger(settings)).close(instance_id, ended)


def settle(settings: Settings) -> None:
    """Close the lease of this ORCH_HOME's host if it powered itself off (autostop) since it
    was last looked at, so that no bill counts past its end. Reads two small files, and the
    ledger only when there is something to close."""
    from orchestrator.host import record as records
    from orchestrator.host.lifecycle import powered_off_at

    record = records.load(settings.home)
    if record is None or record.kind != "launched":
        return
    off_at = powered_off_at(settings, record)
    if off_at is not None:
        close_lease(settings, record.instance_id, off_at)


def settle_recorded(home: Path) -> None:
    """`settle`, for a command that loads no settings unless it must (`orch cost`): reads
    only ORCH_HOME/controller-host/host.json when no launched host is recorded there."""
    from orchestrator.host import record as records

    record = records.load(home)
    if record is not None and record.kind == "launched":
        settle(load_settings())


def host_line(settings: Settings) -> dict[str, Any] | None:
    """This ORCH_HOME's current launched host's line of the bill (see
    `report.documents.host_line`); None without one."""
    from orchestrator.host import record as records
    from orchestrator.ledger.host_leases import HostLeases
    from orchestrator.ledger.measures import utcnow
    from orchestrator.report.documents import host_line as line

    record = records.load(settings.home)
    if record is None or record.instance_id is None:
        return None
    settle(settings)
    for lease in HostLeases(open_ledger(settings)).all():
        if lease.instance_id == record.instance_id:
            return line(lease, utcnow())
    return None
