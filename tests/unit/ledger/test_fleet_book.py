"""Fleets in the ledger (`ledger.fleets.FleetBook`) on a real SQLite file: a fleet is recorded
whole or not at all; a job's claim holds every slot of every node or none, never a slot held
already nor one of an unhealthy host; releases, the queue, removal while busy, utilization;
and migration 0006 on a ledger of the revision before. The race of two ledgers on PostgreSQL:
tests/integration/test_fleet_claim_race.py."""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import IntegrityError

from orchestrator.errors import FleetBusy, FleetError, FleetExists, FleetNotFound
from orchestrator.job_state import JobState
from orchestrator.ledger.fleets import (
    Fleet,
    FleetBook,
    FleetHost,
    FleetWaiter,
    NodeClaim,
)
from orchestrator.ledger.migrate import alembic_config
from orchestrator.ledger.migrations import HEAD
from orchestrator.ledger.store import Ledger, make_engine
from orchestrator.ledger.view import LedgerView, open_view
from orchestrator.providers.ssh.placement import HostSlots, place
from tests.support.lease_rows import add_job

T0 = datetime(2026, 3, 1, 12, tzinfo=UTC)
A100 = "NVIDIA A100-SXM4-80GB"


def fleet(name: str = "lab") -> Fleet:
    return Fleet(
        name=name, identity="/home/u/.ssh/id_ed25519", price_per_hour="2.50", price_unit="host",
        owner="ana", created_at=T0,
    )  # fmt: skip


def host(address: str, gpus: int = 2, cpus: int = 8, port: int = 22) -> FleetHost:
    listed = [{"index": i, "name": A100, "memory_mib": 81920} for i in range(gpus)]
    return FleetHost(
        fleet="", position=0, user="root", address=address, port=port,
        host_key="ssh-ed25519 AAAAC3Nza", gpus=json.dumps(listed), cpus=cpus, memory_mib=64000,
        disk_free_gb=100.0, python="3.12.3", torch="2.5.1", checked_at=T0,
    )  # fmt: skip


@pytest.fixture
def book(ledger: Ledger) -> FleetBook:
    """Fleet `lab`: two hosts of 2 GPUs and a CPU host of 4 slots."""
    book = FleetBook(ledger)
    hosts = [host("10.0.0.1"), host("10.0.0.2"), host("10.0.0.3", gpus=0, cpus=4)]
    book.add(fleet(), hosts)
    assert [h.id for h in hosts] == ids(book)  # the caller's rows stay readable, ids set
    return book


def ids(book: FleetBook, name: str = "lab") -> list[int]:
    return [h.id for h in book.get(name)[1]]  # type: ignore[misc]


# --- fleets ---------------------------------------------------------------------------------


def test_a_fleet_is_recorded_with_its_hosts_in_order(book: FleetBook) -> None:
    recorded, hosts = book.get("lab")
    assert (recorded.identity, recorded.price_per_hour, recorded.created_at) == (
        "/home/u/.ssh/id_ed25519", "2.50", T0,
    )  # fmt: skip
    assert [(h.address, h.position, h.fleet) for h in hosts] == [
        ("10.0.0.1", 0, "lab"), ("10.0.0.2", 1, "lab"), ("10.0.0.3", 2, "lab"),
    ]  # fmt: skip
    assert [h.slots() for h in hosts] == [(0, 1), (0, 1), (0, 1, 2, 3)]
    assert [f.name for f in book.fleets()] == ["lab"]


def test_a_taken_name_or_a_host_listed_twice_records_nothing(book: FleetBook) -> None:
    with pytest.raises(FleetExists, match="'lab' is in the ledger already") as taken:
        book.add(fleet(), [host("10.0.0.9")])
    assert taken.value.exit_code == 2 and "orch fleet remove lab" in str(taken.value)
    with pytest.raises(FleetError, match="10.0.0.5:22 is listed twice"):
        book.add(fleet("other"), [host("10.0.0.5"), host("10.0.0.5")])
    for bad, why in (
        (fleet("x").model_copy(update={"price_per_hour": "-1"}), "is not a price"),
        (fleet("x").model_copy(update={"price_per_hour": "two"}), "is not a price"),
        (fleet("x").model_copy(update={"price_unit": "node"}), "is not a price"),
    ):
        with pytest.raises(FleetError, match=why):
            book.add(bad, [host("10.0.0.6")])
    with pytest.raises(FleetError, match="has no host"):
        book.add(fleet("x"), [])
    assert [f.name for f in book.fleets()] == ["lab"]
    assert [h.address for h in book.get("lab")[1]] == ["10.0.0.1", "10.0.0.2", "10.0.0.3"]


def test_a_machine_of_another_fleet_is_refused_whoever_writes_it(book: FleetBook) -> None:
    """Two fleets naming one machine could hand out its GPUs twice: `add` refuses it and
    records nothing, and the unique index refuses it to a writer that did not look first (an
    `add` racing this one)."""
    with pytest.raises(FleetError, match=r"10.0.0.2:22 \(in fleet lab\) is in another") as why:
        book.add(fleet("other"), [host("10.0.0.9"), host("10.0.0.2")])
    assert "fleet other was not recorded" in str(why.value)
    assert "orch fleet remove lab" in str(why.value)
    with pytest.raises(FleetError, match="are in another fleet"):
        book.refuse_taken("other", [("10.0.0.1", 22), ("10.0.0.3", 22), ("10.0.0.9", 22)])
    book.refuse_taken("other", [("10.0.0.1", 2222), ("10.0.0.9", 22)])  # other machines
    assert [f.name for f in book.fleets()] == ["lab"]
    with pytest.raises(IntegrityError), book.engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO fleet_host (fleet, position, user, address, port, host_key, gpus, "
                "cpus, memory_mib, disk_free_gb, healthy, health_note, checked_at) VALUES "
                "('lab', 9, 'u', '10.0.0.1', 22, 'k', '[]', 1, 1, 1.0, 1, '', '2026-03-01')"
            )
        )
    book.add(fleet("other"), [host("10.0.0.2", port=2222)])
    book.remove("lab")
    book.add(fleet("again"), [host("10.0.0.2")])  # free once its fleet is removed


def test_an_unknown_fleet_names_the_fleets_there_are(book: FleetBook) -> None:
    with pytest.raises(FleetNotFound, match=r"no fleet 'nope' in the ledger \(fleets: lab\)") as e:
        book.get("nope")
    assert "orch fleet add" in str(e.value)
    for call in (
        lambda: book.host_slots("nope"),
        lambda: book.remove("nope"),
        lambda: book.wait(
            FleetWaiter(job_id="j", fleet="nope", nodes=1, slots_per_node=1, owner="ana", since=T0)
        ),  # fmt: skip
    ):
        with pytest.raises(FleetNotFound):
            call()


# --- claims ---------------------------------------------------------------------------------


def test_a_claim_holds_every_slot_of_every_node_or_none(book: FleetBook) -> None:
    one, two, _ = ids(book)
    first = book.claim("lab", "j-1", "ana", [NodeClaim(0, one, (0,), "s-a")], T0)
    assert first is not None and [(c.host_id, c.slot, c.job_id) for c in first] == [(one, 0, "j-1")]
    # j-2 wants host two whole and host one's slot 0, held by j-1: nothing of it is written
    clash = [NodeClaim(0, two, (0, 1), "s-b"), NodeClaim(1, one, (0, 1), "s-c")]
    assert book.claim("lab", "j-2", "bo", clash, T0) is None
    assert [(c.job_id, c.host_id, c.slot) for c in book.held("lab")] == [("j-1", one, 0)]
    fits = [NodeClaim(0, two, (0, 1), "s-b"), NodeClaim(1, one, (1,), "s-c")]
    claims = book.claim("lab", "j-2", "bo", fits, T0)
    assert claims is not None and len(claims) == 3
    assert {(c.rank, c.instance_id) for c in book.held(job_id="j-2")} == {(0, "s-b"), (1, "s-c")}
    slots = book.host_slots("lab")
    assert [(s.free, s.healthy) for s in slots] == [((), True), ((), True), ((0, 1, 2, 3), True)]
    assert slots[0].gpu_names == (A100, A100) and slots[2].gpu_names == ()


def test_no_claim_on_an_unhealthy_host_or_one_of_another_fleet(book: FleetBook) -> None:
    one, two, _ = ids(book)
    book.mark_health(two, False, "ssh: connection timed out", T0 + timedelta(minutes=1))
    sick = book.get("lab")[1][1]
    assert (sick.healthy, sick.health_note, sick.checked_at) == (
        False, "ssh: connection timed out", T0 + timedelta(minutes=1),
    )  # fmt: skip
    both = [NodeClaim(0, one, (0,), "s-a"), NodeClaim(1, two, (0,), "s-b")]
    assert book.claim("lab", "j-1", "ana", both, T0) is None
    assert book.held() == []
    assert not book.host_slots("lab")[1].healthy
    book.add(fleet("other"), [host("10.0.1.1")])
    (elsewhere,) = ids(book, "other")
    assert book.claim("lab", "j-1", "ana", [NodeClaim(0, elsewhere, (0,), "s-x")], T0) is None
    book.mark_health(two, True, "", T0 + timedelta(minutes=2))
    assert book.claim("lab", "j-1", "ana", both, T0) is not None


def test_nodes_that_break_the_placement_rules_are_refused(book: FleetBook) -> None:
    one, two, cpu = ids(book)
    for nodes in (
        [NodeClaim(0, one, (0,), "s-a"), NodeClaim(1, one, (1,), "s-b")],  # one host twice
        [NodeClaim(0, one, (2,), "s-a")],  # a slot the host does not have
        [NodeClaim(0, cpu, (4,), "s-a")],
        [NodeClaim(0, one, (0,), "s-a"), NodeClaim(1, two, (0,), "s-a")],  # one instance twice
        [NodeClaim(0, one, (), "s-a")],
    ):
        with pytest.raises(ValueError):
            book.claim("lab", "j-1", "ana", nodes, T0)
    assert book.held() == []


def test_the_unique_index_refuses_a_second_held_claim_whoever_writes_it(
    book: FleetBook, ledger: Ledger
) -> None:
    one, _, _ = ids(book)
    book.claim("lab", "j-1", "ana", [NodeClaim(0, one, (0,), "s-a")], T0)
    raw = (
        "INSERT INTO fleet_claim (host_id, slot, job_id, rank, instance_id, owner, claimed_at,"
        " released_at) VALUES (:host, 0, 'j-2', 0, 's-b', 'bo', '2026-03-01T12:00:00+00:00', NULL)"
    )
    with pytest.raises(IntegrityError), ledger.engine.begin() as connection:
        connection.execute(text(raw), {"host": one})
    assert book.release(["s-a"], T0 + timedelta(hours=1)) == 1
    with ledger.engine.begin() as connection:  # released: the slot may be held again
        connection.execute(text(raw), {"host": one})


def test_release_is_idempotent_and_frees_the_slots(book: FleetBook) -> None:
    one, two, _ = ids(book)
    nodes = [NodeClaim(0, one, (0, 1), "s-a"), NodeClaim(1, two, (1,), "s-b")]
    assert book.claim("lab", "j-1", "ana", nodes, T0) is not None
    assert book.release(["s-a"], T0 + timedelta(minutes=5)) == 2
    assert book.release(["s-a", "s-gone"], T0 + timedelta(minutes=9)) == 0
    assert book.release([], T0) == 0
    assert [(c.instance_id, c.slot) for c in book.held()] == [("s-b", 1)]
    assert [s.free for s in book.host_slots("lab")][:2] == [(0, 1), (0,)]


def test_placement_on_the_books_slots_then_a_claim(book: FleetBook) -> None:
    hosts = book.host_slots("lab")
    placed = place(hosts, ranks=[0, 1], slots_per_node=2)
    assert placed is not None
    nodes = [NodeClaim(p.rank, p.host_id, p.slots, f"s-{p.rank}") for p in placed]
    assert book.claim("lab", "j-1", "ana", nodes, T0) is not None
    again = book.host_slots("lab")
    assert isinstance(again[0], HostSlots)
    assert place(again, ranks=[0, 1], slots_per_node=2) is None  # only the CPU host is left
    assert place(again, ranks=[0], slots_per_node=2) == [
        type(placed[0])(0, hosts[2].host_id, (0, 1))
    ]


# --- the queue and removal ------------------------------------------------------------------


def waiter(job_id: str, minutes: int) -> FleetWaiter:
    return FleetWaiter(
        job_id=job_id, fleet="lab", nodes=1, slots_per_node=2, owner="ana",
        since=T0 + timedelta(minutes=minutes),
    )  # fmt: skip


def test_the_queue_is_in_order_of_arrival_and_waiting_twice_keeps_the_place(
    book: FleetBook,
) -> None:
    for job_id, minutes in (("j-c", 2), ("j-b", 1), ("j-a", 2)):
        book.wait(waiter(job_id, minutes))
    book.wait(waiter("j-b", 9))  # waits already: keeps its place
    assert [(w.job_id, w.since) for w in book.queue("lab")] == [
        ("j-b", T0 + timedelta(minutes=1)), ("j-a", T0 + timedelta(minutes=2)),
        ("j-c", T0 + timedelta(minutes=2)),
    ]  # fmt: skip
    book.stop_waiting("j-b")
    book.stop_waiting("j-b")
    assert [w.job_id for w in book.queue("lab")] == ["j-a", "j-c"]


def test_a_job_that_ended_waits_no_more_whatever_its_row_says(
    book: FleetBook, ledger: Ledger
) -> None:
    add_job(ledger, "j-live", state=JobState.WAITING)
    add_job(ledger, "j-gone", state=JobState.CANCELLED)  # its controller died as it waited
    for job_id, minutes in (("j-gone", 1), ("j-live", 2)):
        book.wait(waiter(job_id, minutes))
    assert [w.job_id for w in book.queue("lab")] == ["j-live"]
    with LedgerView.of_engine(ledger.engine) as view:
        assert view.fleet_queues() == {"j-live": {"fleet": "lab", "position": 1, "of": 1}}
    book.stop_waiting("j-live")
    book.remove("lab")  # the ended job's row keeps nothing busy


def test_a_busy_fleet_is_not_removed_and_names_its_jobs(book: FleetBook) -> None:
    one, _, _ = ids(book)
    book.claim("lab", "j-1", "ana", [NodeClaim(0, one, (0,), "s-a")], T0)
    book.wait(waiter("j-2", 1))
    with pytest.raises(FleetBusy, match=r"job\(s\) j-1, j-2") as busy:
        book.remove("lab")
    assert busy.value.exit_code == 2 and "orch cancel" in str(busy.value)
    book.release(["s-a"], T0 + timedelta(hours=1))
    with pytest.raises(FleetBusy, match=r"job\(s\) j-2 "):
        book.remove("lab")
    book.stop_waiting("j-2")
    book.remove("lab")
    assert book.fleets() == []
    with pytest.raises(FleetNotFound, match=r"\(fleets: none\)"):
        book.get("lab")
    book.add(fleet(), [host("10.0.0.1")])  # the name is free again
    assert book.held() == []


# --- utilization ----------------------------------------------------------------------------


def test_usage_counts_capacity_and_held_host_hours_in_the_window(book: FleetBook) -> None:
    one, two, _ = ids(book)
    h = timedelta(hours=1)
    # host one: slot 0 for hours 1-3 and slot 1 for hours 2-4 (held 3 h, 4 slot-hours);
    # host two: slot 0 from hour 5, still held
    book.claim("lab", "j-1", "ana", [NodeClaim(0, one, (0,), "s-a")], T0 + h)
    book.claim("lab", "j-2", "ana", [NodeClaim(0, one, (1,), "s-b")], T0 + 2 * h)
    book.release(["s-a"], T0 + 3 * h)
    book.release(["s-b"], T0 + 4 * h)
    book.claim("lab", "j-3", "ana", [NodeClaim(0, two, (0,), "s-c")], T0 + 5 * h)
    # the window starts before the fleet existed: its capacity counts from T0
    usage = book.usage("lab", T0 - 10 * h, T0 + 6 * h)
    assert usage.host_hours == pytest.approx(3 * 6)
    assert usage.slot_hours == pytest.approx((2 + 2 + 4) * 6)
    assert usage.held_hours == pytest.approx(3 + 1)
    assert usage.held_slot_hours == pytest.approx(2 + 2 + 1)
    assert usage.utilization == pytest.approx(4 / 18)
    clipped = book.usage("lab", T0 + 2.5 * h, T0 + 3.5 * h)
    assert (clipped.host_hours, clipped.held_hours) == (pytest.approx(3), pytest.approx(1))
    assert clipped.held_slot_hours == pytest.approx(0.5 + 1)
    assert book.usage("lab", T0 - 2 * h, T0 - h).utilization == 0.0


# --- migration 0006 -------------------------------------------------------------------------


def test_a_ledger_of_the_revision_before_gets_the_fleet_tables_and_keeps_its_rows(
    tmp_path: Path,
) -> None:
    from alembic import command

    path = tmp_path / "orch.db"
    engine = create_engine(f"sqlite:///{path}")
    with engine.begin() as connection:
        command.upgrade(alembic_config(connection), "0005")
        connection.execute(text("INSERT INTO ledger_meta VALUES ('ledger_id', 'feed')"))
    engine.dispose()
    assert open_view(path) is None  # not this orch's schema yet: the full path migrates it
    migrated = Ledger(make_engine(path))
    assert migrated.ledger_id == "feed"
    book = FleetBook(migrated)
    book.add(fleet(), [host("10.0.0.1")])
    assert book.host_slots("lab")[0].free == (0, 1)
    migrated.engine.dispose()
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT version_num FROM alembic_version").fetchall() == [(HEAD,)]
    view = open_view(path)  # the list views read the migrated ledger as is
    assert view is not None
    view.close()
