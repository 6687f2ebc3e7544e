"""A job whose ledger died with its controller host, rebuilt from its kit and running nodes: the
rows it gets (`control.repair.rebuild.rebuilt_rows`), and how they reach a ledger that takes on the
dead
ledger's id in the same transaction (`ledger.rebuilt`), on a real SQLite ledger."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from sqlmodel import Session, select

from orchestrator.config import load_settings
from orchestrator.control.money.stop_rules import budget_order, runtime_order
from orchestrator.control.process.controllers import save_job_record
from orchestrator.control.repair.carried import CARRIED, Carried, CarriedLease
from orchestrator.control.repair.rebuild import NotRebuildable, rebuild, rebuilt_rows
from orchestrator.errors import LedgerError
from orchestrator.job_state import JobState
from orchestrator.ledger.measures import hourly_rate, total_cost
from orchestrator.ledger.rebuilt import LedgerIdTaken, write_rebuilt_job
from orchestrator.ledger.store import Job, Lease, Ledger, LedgerMeta, utcnow
from orchestrator.providers.base import Instance
from orchestrator.spec.model import JobSpec, LoadedJob

JOB = "train-3f9c1a"
DEAD_LEDGER = "0123456789abcdef"
T0 = datetime(2026, 12, 6, 2, 0, tzinfo=UTC)


def loaded(tmp_path: Path, nodes: int = 2) -> LoadedJob:
    spec = JobSpec.model_validate(
        {"name": "train", "workdir": ".", "run": "python train.py",
         "resources": {"nodes": nodes, "gpus_per_node": 4}, "secrets": {"TOKEN": "s3cret"}}
    )  # fmt: skip
    return LoadedJob(spec, tmp_path / "job.yaml", tmp_path, tmp_path, [])


def node(rank: int, launched: datetime, *, ledger_id: str | None = DEAD_LEDGER) -> Instance:
    return Instance(
        instance_id=f"i-{rank:04d}", job_id=JOB, cluster=f"{JOB}-a0", rank=rank,
        private_ip=f"10.0.0.{rank + 1}", ssh_host="127.0.0.1", ssh_port=2200 + rank,
        ssh_user="root", host_key="ssh-ed25519 AAAA", interface="eth0", market="spot",
        instance_type="g5.12xlarge", price_per_hour=Decimal("2.0712"), launched_at=launched,
        ledger_id=ledger_id,
    )  # fmt: skip


def rows(tmp_path: Path, instances: list[Instance]):  # type: ignore[no-untyped-def]
    return rebuilt_rows(
        loaded(tmp_path), JOB, instances, provider="aws", submitted_at=T0,
        controller="host:42", owner="ana", now=T0 + timedelta(hours=5),
    )  # fmt: skip


def test_a_job_is_rebuilt_running_on_its_nodes_billed_from_their_launch(tmp_path: Path) -> None:
    later = T0 + timedelta(minutes=3)
    built = rows(tmp_path, [node(1, later), node(0, T0 + timedelta(minutes=2))])

    job = built.job
    assert (job.id, job.name, job.state, job.provider) == (JOB, "train", JobState.RUNNING, "aws")
    assert (job.nodes, job.gpus_per_node, job.owner, job.controller) == (2, 4, "ana", "host:42")
    assert job.created_at == T0 and job.started_at == T0 + timedelta(minutes=2)
    assert "s3cret" not in job.spec_json  # a secret's value never reaches the ledger
    assert json.loads(job.spec_json)["run"] == "python train.py"
    assert [(lease.rank, lease.instance_id) for lease in built.leases] == [
        (0, "i-0000"), (1, "i-0001"),
    ]  # fmt: skip
    first = built.leases[0]
    assert (first.price_per_hour, first.launched_at, first.market) == (
        Decimal("2.0712"), T0 + timedelta(minutes=2), "spot",
    )  # fmt: skip
    assert first.ended_at is None and first.cluster == f"{JOB}-a0"
    assert built.ledger_id == DEAD_LEDGER
    [event] = built.events
    assert event.kind == "REBUILT" and "ranks 0, 1" in event.message


def test_a_job_with_no_running_node_is_not_rebuilt(tmp_path: Path) -> None:
    with pytest.raises(NotRebuildable, match="no node of job .* runs any more"):
        rows(tmp_path, [])


def test_nodes_of_two_ledgers_are_not_rebuilt(tmp_path: Path) -> None:
    with pytest.raises(NotRebuildable, match="several ledgers"):
        rows(tmp_path, [node(0, T0), node(1, T0, ledger_id="fedcba9876543210")])


def test_untagged_nodes_leave_the_ledger_its_own_id(tmp_path: Path) -> None:
    assert rows(tmp_path, [node(0, T0, ledger_id=None)]).ledger_id is None


def test_the_ledger_takes_on_the_dead_ledgers_id_with_the_job(
    tmp_path: Path, ledger: Ledger
) -> None:
    own = ledger.ledger_id  # made at first use, as a fresh host's daemon does
    assert own != DEAD_LEDGER
    built = rows(tmp_path, [node(0, T0), node(1, T0)])

    write_rebuilt_job(ledger, built.job, built.leases, built.events, ledger_id=DEAD_LEDGER)

    assert ledger.ledger_id == DEAD_LEDGER  # the cached id was dropped
    assert ledger.get_job(JOB).state == JobState.RUNNING
    assert [lease.instance_id for lease in ledger.leases(JOB, open_only=True)] == [
        "i-0000", "i-0001",
    ]  # fmt: skip
    assert [e.kind for e in ledger.events(JOB)] == ["REBUILT"]
    with Session(ledger.engine) as session:
        assert session.exec(select(LedgerMeta.value)).all() == [DEAD_LEDGER]


def test_a_ledger_with_jobs_of_its_own_keeps_its_id_and_writes_nothing(
    tmp_path: Path, ledger: Ledger
) -> None:
    own = ledger.ledger_id
    ledger.add_job(
        Job(id="mine-1", name="mine", provider="aws", nodes=1, gpus_per_node=1, spec_json="{}",
            spec_path="job.yaml", created_at=utcnow())
    )  # fmt: skip
    built = rows(tmp_path, [node(0, T0)])

    with pytest.raises(LedgerIdTaken, match="holds jobs of its own"):
        write_rebuilt_job(ledger, built.job, built.leases, built.events, ledger_id=DEAD_LEDGER)

    assert ledger.ledger_id == own
    assert [job.id for job in ledger.jobs()] == ["mine-1"]
    with Session(ledger.engine) as session:
        assert session.exec(select(Lease)).all() == []


def test_a_job_the_ledger_knows_is_not_written_again(tmp_path: Path, ledger: Ledger) -> None:
    built = rows(tmp_path, [node(0, T0)])
    write_rebuilt_job(ledger, built.job, built.leases, built.events, ledger_id=DEAD_LEDGER)
    again = rows(tmp_path, [node(0, T0)])
    with pytest.raises(LedgerError, match="knows job"):
        write_rebuilt_job(ledger, again.job, again.leases, again.events, ledger_id=DEAD_LEDGER)
    assert len(ledger.leases(JOB)) == 1


class ListedNodes:
    """A provider that only lists nodes (`rebuild` ends and launches none)."""

    name = "aws"

    def __init__(self, instances: list[Instance]) -> None:
        self.instances = instances
        self.asked: list[str | None] = []

    def list_owned(self, *, job_id: str | None = None) -> list[Instance]:
        self.asked.append(job_id)
        return [i for i in self.instances if job_id in (None, i.job_id)]


def test_rebuild_needs_the_kit_and_leaves_a_known_job_alone(tmp_path: Path, ledger: Ledger) -> None:
    settings = load_settings({"ORCH_HOME": str(tmp_path / "home")})
    nodes = ListedNodes([node(0, T0)])

    assert rebuild(settings, ledger, JOB, lambda _: nodes).status == "lost"  # no kit
    save_job_record(settings, JOB, loaded(tmp_path, nodes=1))
    missing_key = rebuild(settings, ledger, JOB, lambda _: nodes)
    assert (missing_key.status, missing_key.detail) == (
        "lost", "its hand-over kit lacks its nodes' SSH key",
    )  # fmt: skip
    settings.keys_dir(JOB).mkdir(parents=True)

    done = rebuild(settings, ledger, JOB, lambda _: nodes)
    assert (done.status, done.detail) == ("rebuilt", "RUNNING on 1 node(s)"), done
    assert nodes.asked == [JOB]
    assert ledger.ledger_id == DEAD_LEDGER
    assert rebuild(settings, ledger, JOB, lambda _: nodes).status == "known"

    gone = ListedNodes([])
    other = "train-000000"
    save_job_record(settings, other, loaded(tmp_path))
    settings.keys_dir(other).mkdir(parents=True)
    result = rebuild(settings, ledger, other, lambda _: gone)
    assert result.status == "lost" and "runs any more" in result.detail


def carried_figures(as_of: datetime) -> Carried:
    """What the laptop kept of a 1-node job that first started at T0 on i-0000, lost it at
    T0+3h and recovered onto i-0001 (running), with i-0002 billing beside it then."""
    price = Decimal("2.0712")

    def lease(iid: str, launched: datetime, ended: datetime | None) -> CarriedLease:
        return CarriedLease(iid, f"{JOB}-a0", 0, "spot", "g5.12xlarge", price, launched, ended)

    return Carried(
        as_of=as_of, started_at=T0, recoveries=1,
        leases=(
            lease("i-0000", T0 - timedelta(minutes=2), T0 + timedelta(hours=3)),
            lease("i-0001", T0 + timedelta(hours=3, minutes=5), None),
            lease("i-0002", T0 + timedelta(hours=3, minutes=5), None),
        ),
    )  # fmt: skip


def test_a_rebuilt_job_keeps_its_first_start_its_recoveries_and_its_whole_bill(
    tmp_path: Path,
) -> None:
    """A job that spent most of its runtime and budget before a recovery and its host's death
    is rebuilt with its first start and every lease: the limits stop it where they would have
    on the old host, not after a fresh max_runtime and budget from the recovered node."""
    as_of = T0 + timedelta(hours=4)
    recovered = replace(node(0, T0 + timedelta(hours=3, minutes=5)), instance_id="i-0001")
    built = rebuilt_rows(
        loaded(tmp_path, nodes=1), JOB, [recovered], provider="aws", submitted_at=T0,
        controller="host:42", owner="ana", now=T0 + timedelta(hours=5),
        carried=carried_figures(as_of),
    )  # fmt: skip

    job = built.job
    assert job.started_at == T0 and job.recoveries == 1
    by_id = {lease.instance_id: lease for lease in built.leases}
    assert by_id["i-0001"].ended_at is None  # the running node, billed from its launch
    assert by_id["i-0000"].ended_at == T0 + timedelta(hours=3)
    assert by_id["i-0002"].ended_at == as_of  # open then, gone now: billed until then
    # 4 h 2 min of max_runtime 4 h: over. The bill: 3h02 + 1h55 + 55 min at $2.0712/h.
    now = T0 + timedelta(hours=5)
    elapsed = (now - job.started_at).total_seconds()
    assert runtime_order(elapsed_s=elapsed, max_runtime_s=4 * 3600) is not None
    spend = total_cost(built.leases, now)
    assert abs(spend - Decimal("2.0712") * (182 + 115 + 55) / 60) < Decimal("1e-9")
    order = budget_order(spend=spend, hourly_rate=hourly_rate(built.leases),
                         max_cost=Decimal(12), max_hourly=None, horizon_s=25)  # fmt: skip
    assert order is not None and order.exit_code == 4
    [event] = built.events
    assert "carried over" in event.message and "i-0002" in event.message, event.message
    assert "$" in event.message and "1 recovery" in event.message


def test_a_rebuild_without_figures_says_what_is_lost(tmp_path: Path) -> None:
    built = rows(tmp_path, [node(0, T0)])
    assert built.job.recoveries == 0
    [event] = built.events
    assert "holds no figures" in event.message and "oldest" in event.message


def test_rebuild_bills_from_the_figures_in_the_kit_and_says_when_they_are_refused(
    tmp_path: Path, ledger: Ledger
) -> None:
    settings = load_settings({"ORCH_HOME": str(tmp_path / "home")})
    running = replace(node(0, T0 + timedelta(hours=3, minutes=5)), instance_id="i-0001")
    save_job_record(settings, JOB, loaded(tmp_path, nodes=1))
    settings.keys_dir(JOB).mkdir(parents=True)
    figures = settings.job_dir(JOB) / CARRIED
    figures.write_text(carried_figures(T0 + timedelta(hours=4)).to_json())

    assert rebuild(settings, ledger, JOB, lambda _: ListedNodes([running])).status == "rebuilt"
    assert ledger.get_job(JOB).started_at == T0
    assert {lease.instance_id for lease in ledger.leases(JOB)} == {"i-0000", "i-0001", "i-0002"}

    other = "train-000000"
    save_job_record(settings, other, loaded(tmp_path, nodes=1))
    settings.keys_dir(other).mkdir(parents=True)
    (settings.job_dir(other) / CARRIED).write_text('{"as_of": "yesterday"}')
    theirs = replace(running, job_id=other)
    assert rebuild(settings, ledger, other, lambda _: ListedNodes([theirs])).status == "rebuilt"
    [event] = ledger.events(other)
    assert "figures are refused: as_of is not a time" in event.message, event.message
