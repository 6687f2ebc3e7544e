"""Controller leases on a shared ledger, on SQLite (a `sqlite:///` URL, which counts as shared)
and on PostgreSQL: taken by exactly one of many racing controllers, renewed by its holder only,
taken over once expired, judged by the ledger's clock whatever a machine's own clock says; a
keeper that finds its lease taken stops (LEASE_LOST) and a keeper that takes over an expired
lease says so; a cancel asked through the lease reaches its holder at its next renewal; which
unfinished jobs a machine revives, leaves to a live controller elsewhere, or reports as another
machine's to revive."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from orchestrator.config import Settings, load_settings
from orchestrator.control.process.adoption import plan_adoption
from orchestrator.control.process.lease_keeper import (
    CANCELLING,
    LEASE_LOST,
    LEASE_TAKEN_OVER,
    LeaseKeeper,
)
from orchestrator.control.process.machine_id import holder_id, machine_id
from orchestrator.ledger.controller_leases import ControllerLeases
from orchestrator.ledger.store import Job, Lease, Ledger, make_engine, utcnow
from orchestrator.ledger.view import open_url_view
from tests.support.helpers import REPO
from tests.support.lease_rows import add_job, age_lease


@pytest.fixture
def ledger(url: str) -> Iterator[Ledger]:
    """The shared ledger at `url` (in place of the SQLite file under tmp_path)."""
    engine = make_engine(url)
    yield Ledger(engine)
    engine.dispose()


def home_settings(home: Path, url: str, **extra: str) -> Settings:
    return load_settings(
        {"ORCH_HOME": str(home), "ORCH_DATABASE_URL": url, "ORCH_CONTROLLER_LEASE": "30",
         "ORCH_LEASE_RENEWAL": "10", **extra}
    )  # fmt: skip


def test_take_renew_release_and_take_over_once_expired(ledger: Ledger) -> None:
    add_job(ledger, "j1")
    leases = ControllerLeases(ledger)
    assert leases.take("j1", "a:1", "a", length_s=30).taken
    refused = leases.take("j1", "b:1", "b", length_s=30)
    assert not refused.taken and refused.lease is not None and refused.lease.holder == "a:1"
    renewed = leases.renew("j1", "a:1", length_s=30)
    assert renewed is not None and renewed.expires_at == renewed.renewed_at + timedelta(seconds=30)
    assert leases.renew("j1", "b:1", length_s=30) is None
    age_lease(ledger, "j1", 29)  # renewed 29 s ago: still a's
    assert not leases.take("j1", "b:1", "b", length_s=30).taken
    age_lease(ledger, "j1", 31)  # 31 s ago: b's
    taken = leases.take("j1", "b:1", "b", length_s=30)
    assert taken.taken and taken.previous is not None and taken.previous.holder == "a:1"
    assert taken.forced_from("b") is None  # it had expired: no force needed
    assert leases.renew("j1", "a:1", length_s=30) is None
    # a dead process of the same machine: its successor (holding the machine's lock) takes it
    assert leases.take("j1", "b:2", "b", length_s=30, dead_on_this_machine=True).taken
    # a live lease of another machine only by force, which says whose it took
    forced = leases.take("j1", "c:1", "c", length_s=30, force=True)
    assert forced.taken and forced.forced_from("c") is not None
    assert forced.previous is not None and forced.previous.holder == "b:2"
    assert not leases.release("j1", "b:2") and leases.release("j1", "c:1")
    assert leases.get("j1") is None


# A machine whose clock is off: orch's own clock (`utcnow`, which every module takes from
# `ledger.measures`) shifted by argv[1] seconds before anything else of orch is imported;
# the database's clock is left as it is. It takes (argv[2] "take") or keeps (renews, "keep")
# the lease of job argv[3] for the ORCH_HOME in the environment and prints whether it holds it.
SKEWED_MACHINE = """
import json, sys
from datetime import datetime, timedelta
import orchestrator.ledger.measures as measures
real = measures.utcnow
measures.utcnow = lambda: real() + timedelta(seconds=float(sys.argv[1]))
from orchestrator.config import load_settings
from orchestrator.control.process.lease_keeper import LeaseKeeper
from orchestrator.ledger.store import Ledger, ledger_engine
settings = load_settings()
keeper = LeaseKeeper(settings, Ledger(ledger_engine(settings)), sys.argv[3])
held = keeper.take().taken
if sys.argv[2] == "keep":
    held = held and keeper.renew()
print(json.dumps({"held": held, "holder": keeper.holder}))
"""


def skewed_machine(home: Path, url: str, skew_s: float, action: str, job_id: str) -> dict:
    env = {"ORCH_HOME": str(home), "ORCH_DATABASE_URL": url, "ORCH_CONTROLLER_LEASE": "30",
           "ORCH_LEASE_RENEWAL": "10", "PATH": "/usr/bin:/bin"}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", SKEWED_MACHINE, str(skew_s), action, job_id],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("skew_s", [600, -600], ids=["ahead", "behind"])
def test_a_machine_whose_clock_is_off_neither_takes_a_live_lease_nor_loses_its_own(
    tmp_path: Path, url: str, ledger: Ledger, skew_s: float
) -> None:
    add_job(ledger, "skew")
    # a machine with a right clock drives the job; one ten minutes off cannot take its lease
    keeper = LeaseKeeper(home_settings(tmp_path / "right", url), ledger, "skew")
    assert keeper.take().taken
    assert not skewed_machine(tmp_path / "off", url, skew_s, "take", "skew")["held"]
    keeper.stop()
    # the skewed machine drives it now (the lease was released): a right one cannot take it
    taken = skewed_machine(tmp_path / "off", url, skew_s, "keep", "skew")
    assert taken["held"]
    lease = ControllerLeases(ledger).get("skew")
    assert lease is not None and lease.holder == taken["holder"]
    assert abs((lease.renewed_at - utcnow()).total_seconds()) < 60  # the ledger's time
    assert not ControllerLeases(ledger).take("skew", "right:2", "right", length_s=30).taken


@pytest.mark.parametrize("expired", [False, True], ids=["new", "expired"])
def test_of_many_controllers_racing_for_one_lease_exactly_one_wins(
    url: str, ledger: Ledger, expired: bool
) -> None:
    add_job(ledger, "race")
    if expired:
        ControllerLeases(ledger).take("race", "dead:1", "dead", length_s=30)
        age_lease(ledger, "race", 60)
    racers = 8
    engines = [make_engine(url) for _ in range(racers)]  # one connection pool each, as processes
    barrier, results = threading.Barrier(racers), [False] * racers

    def race(n: int) -> None:
        barrier.wait()
        claim = ControllerLeases(Ledger(engines[n])).take("race", f"m{n}:1", f"m{n}", length_s=30)
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
    keeper = LeaseKeeper(home_settings(tmp_path / "a", url), ledger, "k1", on_lost=lost.append)
    assert keeper.take().taken
    assert keeper.renew() and not lost
    age_lease(ledger, "k1", 31)  # it missed its renewals; another machine takes over
    assert ControllerLeases(ledger).take("k1", "b:9", "b", length_s=30).taken
    assert not keeper.renew()
    assert len(lost) == 1 and "now held by b:9 (machine b)" in lost[0]
    events = [e for e in ledger.events("k1") if e.kind == LEASE_LOST]
    assert len(events) == 1 and keeper.holder in events[0].message
    assert "left the job's nodes as they were" in events[0].message


def test_a_keeper_that_takes_over_an_expired_lease_records_it(
    tmp_path: Path, url: str, ledger: Ledger
) -> None:
    add_job(ledger, "k2")
    ControllerLeases(ledger).take("k2", "a:1", "a", length_s=30)
    age_lease(ledger, "k2", 120)
    keeper = LeaseKeeper(home_settings(tmp_path / "b", url), ledger, "k2")
    assert keeper.take().taken
    keeper.stop()  # releases it
    assert ControllerLeases(ledger).get("k2") is None
    (event,) = [e for e in ledger.events("k2") if e.kind == LEASE_TAKEN_OVER]
    assert "of a:1 (machine a)" in event.message


def test_a_cancel_asked_through_the_lease_reaches_its_holder_once(
    tmp_path: Path, url: str, ledger: Ledger
) -> None:
    add_job(ledger, "k3")
    asked: list[str] = []
    keeper = LeaseKeeper(home_settings(tmp_path / "a", url), ledger, "k3", on_cancel=asked.append)
    assert keeper.take().taken
    leases = ControllerLeases(ledger)
    assert leases.ask_cancel("k3", "b-1:7") is not None
    assert keeper.renew() and keeper.renew()  # taken up at the first renewal, once
    assert len(asked) == 1 and asked[0].startswith("b-1:7, asked through the ledger at ")
    (event,) = [e for e in ledger.events("k3") if e.kind == CANCELLING]
    assert keeper.holder in event.message and "b-1:7" in event.message
    assert leases.withdraw_cancel("k3", "b-1:7") and not leases.withdraw_cancel("k3", "b-1:7")
    keeper.stop()
    assert leases.ask_cancel("k3", "b-1:7") is None  # no lease, nobody to ask


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
    leases = ControllerLeases(ledger)
    me, now = machine_id(here.home), leases.now()
    past = now - timedelta(minutes=1)

    def leased(job_id: str, machine: str, at: datetime) -> Job:
        job = add_job(ledger, job_id, controller=holder_id(machine, 1))
        ledger.open_lease(Lease(job_id=job_id, cluster=job_id, provider="local",
                                instance_id=f"i-{job_id}", rank=0,
                                market="on-demand", instance_type="local", price_per_hour=0,
                                launched_at=past))  # fmt: skip
        leases.take(job_id, holder_id(machine, 1), machine, length_s=30)
        age_lease(ledger, job_id, (now - at).total_seconds())
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
    # the same plan through the ledger's read model (what the check before every command reads)
    view = open_url_view(url)
    assert view is not None
    with view:
        assert plan_adoption(here, view, view.jobs(), now=now) == adoption
        assert abs((view.clock() - leases.now()).total_seconds()) < 5
    # the SQLite file under ORCH_HOME is this home's alone: today's rule, the file lock only
    own = load_settings({"ORCH_HOME": str(here.home)})
    assert sorted(plan_adoption(own, ledger, ledger.jobs(), now=now).revive) == [
        "dead-there-keys-here", "dead-there-no-keys", "live-there-files-here", "mine-dead"
    ]  # fmt: skip
