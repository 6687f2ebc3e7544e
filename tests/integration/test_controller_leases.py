"""Controller leases on a shared ledger, on SQLite (a `sqlite:///` URL, which counts as shared)
and on PostgreSQL: taken by exactly one of many racing controllers, renewed by its holder only,
taken over once expired; a keeper that finds its lease taken stops (LEASE_LOST) and a keeper
that takes over an expired lease says so; which unfinished jobs a machine revives, leaves to a
live controller elsewhere, or reports as another machine's to revive."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from orchestrator.config import Settings, load_settings
from orchestrator.control.adoption import plan_adoption
from orchestrator.control.lease_keeper import LEASE_LOST, LEASE_TAKEN_OVER, LeaseKeeper
from orchestrator.control.machine_id import holder_id, machine_id
from orchestrator.ledger.controller_leases import ControllerLeases
from orchestrator.ledger.store import Job, Lease, Ledger, make_engine, utcnow


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A new shared ledger's URL: a SQLite file by URL, then a PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'shared.db'}"
    return request.getfixturevalue("postgres_url")


@pytest.fixture
def ledger(url: str) -> Iterator[Ledger]:
    engine = make_engine(url)
    yield Ledger(engine)
    engine.dispose()


def home_settings(home: Path, url: str, **extra: str) -> Settings:
    return load_settings(
        {"ORCH_HOME": str(home), "ORCH_DATABASE_URL": url, "ORCH_CONTROLLER_LEASE": "30",
         "ORCH_LEASE_RENEWAL": "10", **extra}
    )  # fmt: skip


def add_job(ledger: Ledger, job_id: str, **fields: object) -> Job:
    fields.setdefault("created_at", utcnow() - timedelta(minutes=5))
    return ledger.add_job(
        Job(id=job_id, name="j", provider="local", nodes=1, gpus_per_node=0, spec_json="{}",
            spec_path="job.yaml", **fields)
    )  # fmt: skip


def test_take_renew_release_and_take_over_once_expired(ledger: Ledger) -> None:
    add_job(ledger, "j1")
    leases, now = ControllerLeases(ledger), utcnow()
    assert leases.take("j1", "a:1", "a", now=now, length_s=30).taken
    refused = leases.take("j1", "b:1", "b", now=now + timedelta(seconds=29), length_s=30)
    assert not refused.taken and refused.lease is not None and refused.lease.holder == "a:1"
    assert leases.renew("j1", "a:1", now=now + timedelta(seconds=10), length_s=30)
    assert not leases.renew("j1", "b:1", now=now, length_s=30)
    # renewed at +10 s: still a's at +39 s, b's at +41 s
    assert not leases.take("j1", "b:1", "b", now=now + timedelta(seconds=39), length_s=30).taken
    taken = leases.take("j1", "b:1", "b", now=now + timedelta(seconds=41), length_s=30)
    assert taken.taken and taken.previous is not None and taken.previous.holder == "a:1"
    assert not leases.renew("j1", "a:1", now=now + timedelta(seconds=42), length_s=30)
    # a dead process of the same machine: its successor (holding the machine's lock) takes it
    assert leases.take("j1", "b:2", "b", now=now, length_s=30, dead_on_this_machine=True).taken
    assert not leases.release("j1", "b:1") and leases.release("j1", "b:2")
    assert leases.get("j1") is None


@pytest.mark.parametrize("expired", [False, True], ids=["new", "expired"])
def test_of_many_controllers_racing_for_one_lease_exactly_one_wins(
    url: str, ledger: Ledger, expired: bool
) -> None:
    add_job(ledger, "race")
    now = utcnow()
    if expired:
        ControllerLeases(ledger).take("race", "dead:1", "dead", now=now - timedelta(minutes=1),
                                      length_s=30)  # fmt: skip
    racers = 8
    engines = [make_engine(url) for _ in range(racers)]  # one connection pool each, as processes
    barrier, results = threading.Barrier(racers), [False] * racers

    def race(n: int) -> None:
        barrier.wait()
        claim = ControllerLeases(Ledger(engines[n])).take(
            "race", f"m{n}:1", f"m{n}", now=now, length_s=30
        )
        results[n] = claim.taken

    threads = [threading.Thread(target=race, args=(n,)) for n in range(racers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    for engine in engines:
        engine.dispose()
    assert sum(results) == 1, results
    winner = results.index(True)
    held = ControllerLeases(ledger).get("race")
    assert held is not None and held.holder == f"m{winner}:1"


def test_a_keeper_whose_lease_was_taken_stops_and_says_so(
    tmp_path: Path, url: str, ledger: Ledger
) -> None:
    add_job(ledger, "k1")
    lost: list[str] = []
    clock = [utcnow()]
    keeper = LeaseKeeper(home_settings(tmp_path / "a", url), ledger, "k1", on_lost=lost.append,
                         clock=lambda: clock[0])  # fmt: skip
    assert keeper.take().taken
    assert keeper.renew() and not lost
    clock[0] += timedelta(seconds=31)  # it missed its renewals; another machine takes over
    assert ControllerLeases(ledger).take("k1", "b:9", "b", now=clock[0], length_s=30).taken
    assert not keeper.renew()
    assert len(lost) == 1 and "now held by b:9 (machine b)" in lost[0]
    events = [e for e in ledger.events("k1") if e.kind == LEASE_LOST]
    assert len(events) == 1 and keeper.holder in events[0].message
    assert "left the job's nodes as they were" in events[0].message


def test_a_keeper_that_takes_over_an_expired_lease_records_it(
    tmp_path: Path, url: str, ledger: Ledger
) -> None:
    add_job(ledger, "k2")
    ControllerLeases(ledger).take("k2", "a:1", "a", now=utcnow() - timedelta(minutes=2),
                                  length_s=30)  # fmt: skip
    keeper = LeaseKeeper(home_settings(tmp_path / "b", url), ledger, "k2")
    assert keeper.take().taken
    keeper.stop()  # releases it
    assert ControllerLeases(ledger).get("k2") is None
    (event,) = [e for e in ledger.events("k2") if e.kind == LEASE_TAKEN_OVER]
    assert "of a:1 (machine a)" in event.message


def job_files(settings: Settings, job: Job, *, keys: bool = True) -> None:
    """What driving `job` from `settings`'s home takes: its record, secrets file and keys."""
    directory = settings.job_dir(job.id)
    directory.mkdir(parents=True)
    (directory / "job.json").write_text("{}")
    (directory / "env.json").write_text("{}")
    if keys:
        settings.keys_dir(job.node_owner).mkdir(parents=True)


def test_which_unfinished_jobs_a_machine_revives_leaves_alone_or_reports(
    tmp_path: Path, url: str, ledger: Ledger
) -> None:
    here = home_settings(tmp_path / "b", url)
    me, now = machine_id(here.home), utcnow()
    leases = ControllerLeases(ledger)
    past = now - timedelta(minutes=1)

    def leased(job_id: str, machine: str, at: object) -> Job:
        job = add_job(ledger, job_id, controller=holder_id(machine, 1))
        ledger.open_lease(Lease(job_id=job_id, cluster=job_id, provider="local",
                                instance_id=f"i-{job_id}", rank=0,
                                market="on-demand", instance_type="local", price_per_hour=0,
                                launched_at=past))  # fmt: skip
        leases.take(job_id, holder_id(machine, 1), machine, now=at, length_s=30)  # type: ignore[arg-type]
        return job

    leased("live-there", "a", now)  # driven on machine a: hands off
    job_files(here, leased("live-there-files-here", "a", now))  # even with its files here
    leased("dead-there", "a", past)  # its controller on a stopped; b has nothing: report
    job_files(here, leased("dead-there-keys-here", "a", past))  # b has it all: adopt
    job_files(here, leased("dead-there-no-keys", "a", past), keys=False)  # no keys: report
    job_files(here, leased("mine-dead", me, now))  # this machine's, no lock holder: revive
    add_job(ledger, "starting", controller=holder_id("a", 2), created_at=now)  # lease coming
    add_job(ledger, "finished", state="SUCCEEDED", controller=holder_id("a", 3))

    adoption = plan_adoption(here, ledger, ledger.jobs(), now=now)
    assert sorted(adoption.revive) == ["dead-there-keys-here", "mine-dead"]
    assert sorted(adoption.live_elsewhere) == ["live-there", "live-there-files-here", "starting"]
    assert sorted((s.job_id, s.machine) for s in adoption.stranded) == [
        ("dead-there", "a"), ("dead-there-no-keys", "a")
    ]  # fmt: skip
    assert adoption.stranded[0].line() == (
        f"job {adoption.stranded[0].job_id}: its controller on machine a stopped; run "
        "`orch reconcile` on a, which holds its keys"
    )
    # the SQLite file under ORCH_HOME is this home's alone: today's rule, the file lock only
    own = load_settings({"ORCH_HOME": str(here.home)})
    assert sorted(plan_adoption(own, ledger, ledger.jobs(), now=now).revive) == [
        "dead-there-keys-here", "dead-there-no-keys", "live-there-files-here", "mine-dead"
    ]  # fmt: skip
