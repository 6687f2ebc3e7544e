"""A launched controller host's own line of the bill: its lease in the ledger, opened once and
closed once, shown by `orch cost` beside the jobs (never as one) and in its total, and closed at
the time its node powered itself off once a command sees that it did."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest

from orchestrator.cli import host_billing
from orchestrator.config import load_settings
from orchestrator.host import record as records
from orchestrator.host.record import HostRecord
from orchestrator.ledger.host_leases import HostLeases, host_spend
from orchestrator.ledger.store import HostLease, Ledger, make_engine
from orchestrator.report.documents import cost_document

LAUNCHED = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
IID = "l-0123456789"
HOST = HostRecord(
    kind="launched", user="root", host="127.0.0.1", port=2222, host_key="ssh-ed25519 AAAA",
    identity="/k/id", root="/x/.orch-host", autostop_s=600.0, version="0.1.0",
    installed_at=LAUNCHED.isoformat(), instance_id=IID, provider="local",
    price_per_hour="0.36", launched_at=LAUNCHED.isoformat(),
)  # fmt: skip


def lease(ended_at: datetime | None = None) -> HostLease:
    return HostLease(
        instance_id=IID,
        provider="local",
        host="root@127.0.0.1:2222",
        price_per_hour=Decimal("0.36"),
        launched_at=LAUNCHED,
        ended_at=ended_at,
    )


def test_a_host_lease_is_opened_once_and_closed_once(tmp_path: Path) -> None:
    leases = HostLeases(Ledger(make_engine(tmp_path / "orch.db")))
    leases.open(lease())
    leases.open(lease(ended_at=LAUNCHED))  # a second open changes nothing
    assert [row.ended_at for row in leases.all()] == [None]
    assert len(leases.open_ones()) == 1
    first = LAUNCHED + timedelta(minutes=30)
    leases.close(IID, first)
    leases.close(IID, first + timedelta(hours=5))
    (row,) = leases.all()
    assert row.ended_at == first and leases.open_ones() == []
    assert host_spend(row, first + timedelta(days=1)) == Decimal("0.18")


def test_orch_cost_shows_the_host_as_its_own_line_and_in_the_total(tmp_path: Path) -> None:
    ledger = Ledger(make_engine(tmp_path / "orch.db"))
    HostLeases(ledger).open(lease(ended_at=LAUNCHED + timedelta(hours=2)))
    document = cost_document(ledger)
    assert document["jobs"] == []
    (line,) = document["hosts"]
    assert line["instance_id"] == IID and line["running"] is False
    assert line["hours"] == pytest.approx(2.0) and line["spend_usd"] == pytest.approx(0.72)
    assert document["total_usd"] == pytest.approx(0.72)


def test_a_host_that_powered_itself_off_stops_billing_then(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ORCH_HOME", str(tmp_path))
    settings = load_settings({"ORCH_HOME": str(tmp_path)})
    records.save(tmp_path, HOST)
    host_billing.open_lease(settings, HOST)
    host_billing.settle(settings)
    assert HostLeases(Ledger(make_engine(settings.db_path))).open_ones() != []
    off = LAUNCHED + timedelta(minutes=10)
    folder = settings.local_root / "powered-off"
    folder.mkdir(parents=True)
    (folder / f"{IID}.json").write_text(json.dumps({"at": off.isoformat()}))
    host_billing.settle_recorded(tmp_path)
    (row,) = HostLeases(Ledger(make_engine(settings.db_path))).all()
    assert row.ended_at == off
    line = host_billing.host_line(settings)
    assert line is not None and line["spend_usd"] == pytest.approx(0.06) and not line["running"]
