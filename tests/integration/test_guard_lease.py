"""The budget lease the controller renews on real nodes (local nodes on 127.0.0.1, over SSH).

Each budget check under the cap writes a fresh lease to every node that answers: the run's
deadline and the time until which what is left of `max_cost_usd` pays for the open leases at
the prices the ledger recorded at launch, less the time a stop takes. The expected times are
worked out here from the ledger's leases, independently of `lease_until`. Each node's lease
is on that node's clock, as the controller measured it (here the nodes share ours, give or
take the measurement): the times are compared on the controller's clock, less the offset
each lease was written with.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import cast

import pytest

from orchestrator.cluster.connections import Cluster
from orchestrator.config import BudgetSettings, Settings
from orchestrator.control.run.attempt import Attempt
from orchestrator.control.run.options import RunnerOptions, SilentReporter
from orchestrator.control.run.parts import job_parts
from orchestrator.control.run.watching import Supervisor
from orchestrator.ledger.store import Job, Lease, Ledger, utcnow
from orchestrator.node import guard
from orchestrator.node.guard_protocol import GuardLayout
from orchestrator.node.launch import home_expr
from orchestrator.providers.base import Provider
from orchestrator.spec.model import JobSpec, LoadedJob
from tests.support.helpers import loopback_cluster

pytestmark = pytest.mark.timeout(120)

JOB_ID = "lease"
MAX_COST = 10.0
PRICE = Decimal("1.80")  # per node and hour, as recorded at launch
MAX_RUNTIME = 7200.0
OPTIONS = RunnerOptions(stop_grace=5.0, stop_allowance=15.0)
RESERVE_S = 20.0  # stop_grace + stop_allowance: kept back for the stop itself
SLACK_S = 0.01  # the lease is written to the millisecond


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with loopback_cluster(tmp_path_factory.mktemp("orch"), JOB_ID, count=2) as built:
        yield built


class Controller:
    """A job with a budget, its ledger, and the supervisor's budget check on the nodes."""

    def __init__(
        self, home: Path, ledger: Ledger, cluster: Cluster, settings: Settings | None = None
    ) -> None:
        self.ledger = ledger
        spec = JobSpec.model_validate(
            {
                "name": "lease", "workdir": ".", "run": "true", "resources": {"nodes": 2},
                "budget": {"max_cost_usd": MAX_COST, "max_runtime": MAX_RUNTIME},
            }
        )  # fmt: skip
        self.launched = utcnow() - timedelta(seconds=1000)
        job = self.ledger.add_job(
            Job(
                id=JOB_ID, name=spec.name, provider="local", nodes=2, gpus_per_node=1,
                spec_json=spec.model_dump_json(), spec_path="job.yaml",
                created_at=self.launched, started_at=self.launched,
            )
        )  # fmt: skip
        for instance in cluster.instances:
            recorded = replace(instance, launched_at=self.launched, price_per_hour=PRICE)
            self.ledger.open_lease(
                Lease.from_instance(recorded, job_id=JOB_ID, provider="local", identity=None)
            )
        parts = job_parts(
            job, LoadedJob(spec, home / "job.yaml", home, home, []),
            settings=settings or Settings(home=home),
            ledger=self.ledger, provider=cast(Provider, None), reporter=SilentReporter(),
            options=OPTIONS,
        )  # fmt: skip
        self.parts = parts
        self.supervisor = Supervisor(
            journal=parts.journal, spec=spec, layout=parts.layout,
            logs_dir=parts.job_dir / "logs", settings=parts.settings, options=OPTIONS,
            provider=parts.provider, reporter=parts.reporter, keeper=parts.keeper,
            guards=parts.guards, driver=None, team=parts.team,
            on_metrics=lambda metrics, read_at: None,
        )  # fmt: skip
        self.attempt = Attempt(cluster.instances, cluster)
        self.attempt.read(f"rm -rf {home_expr(GuardLayout(JOB_ID).root)}")  # no lease yet

    def check_budget(self) -> list[dict]:
        """One budget check; returns the lease each node holds afterwards, by rank, its times
        on the controller's clock."""
        assert self.supervisor.check_budget(self.attempt) is None  # under the cap
        path = home_expr(GuardLayout(JOB_ID).lease)
        held = self.attempt.read(f"cat {path} 2>/dev/null")
        assert all(held), f"nodes without a lease: {[r for r, text in enumerate(held) if not text]}"
        leases = []
        for instance, text in zip(self.attempt.instances, held, strict=True):
            doc = json.loads(text)
            assert doc.pop("job_id") == JOB_ID and doc.pop("signature")
            offset = self.parts.guards.lease_offsets[instance.instance_id]
            assert abs(offset) < 5, "the nodes run on this machine's clock"
            for name in ("renewed_at", "runtime_deadline", "lease_until"):
                doc[name] = None if doc[name] is None else doc[name] - offset
            leases.append(doc)
        return leases

    def budget_buys_until(self, at: float) -> float:
        """Until when the rest of the budget at time `at` pays for the open leases, less the
        stop's reserve: worked out from the ledger's leases."""
        spent, hourly = 0.0, 0.0
        for lease in self.ledger.leases(JOB_ID):
            end = lease.ended_at.timestamp() if lease.ended_at else at
            spent += float(lease.price_per_hour) * (min(end, at) - lease.launched_at.timestamp())
            if lease.ended_at is None:
                hourly += float(lease.price_per_hour)
        spent /= 3600
        return at + (MAX_COST - spent) / hourly * 3600 - RESERVE_S


def test_each_budget_check_renews_the_nodes_lease_within_what_the_budget_buys(
    tmp_path: Path, ledger: Ledger, cluster: Cluster
) -> None:
    """Every check writes a new lease to the nodes; its end is never past what the rest of the
    budget buys at the recorded prices: it moves back when spend grows and forward when a
    node's lease closes, and a node taken for gone keeps its last one."""
    controller = Controller(tmp_path, ledger, cluster)
    deadline = controller.launched.timestamp() + MAX_RUNTIME
    path = home_expr(GuardLayout(JOB_ID).lease)
    assert controller.attempt.read(f"cat {path} 2>/dev/null") == ["", ""]

    before = utcnow().timestamp()
    first = controller.check_budget()
    assert first[0] == pytest.approx(first[1], abs=1e-5), "every node gets the same lease"
    lease = first[0]
    assert before <= lease["renewed_at"] <= utcnow().timestamp()
    assert lease["runtime_deadline"] == pytest.approx(deadline, abs=1e-3)
    # $10 at 2 x $1.80/h lasts 10000 s from the launch; $1 of it is spent by now
    until = controller.budget_buys_until(lease["renewed_at"])
    assert until == pytest.approx(controller.launched.timestamp() + 10000 - RESERVE_S, abs=0.01)
    assert until - SLACK_S <= lease["lease_until"] <= until

    # A previous launch of the job cost $3.60: the lease shrinks by the hour that paid for.
    controller.ledger.open_lease(
        Lease(
            job_id=JOB_ID, cluster=JOB_ID, provider="local", instance_id="l-earlier", rank=0,
            market="on-demand", instance_type="local", price_per_hour=Decimal("3.60"),
            launched_at=controller.launched - timedelta(hours=2),
            ended_at=controller.launched - timedelta(hours=1),
        )
    )  # fmt: skip
    second = controller.check_budget()
    assert second[0] == pytest.approx(second[1], abs=1e-5)
    lease = second[0]
    assert lease["renewed_at"] > first[0]["renewed_at"]
    until = controller.budget_buys_until(lease["renewed_at"])
    assert until - SLACK_S <= lease["lease_until"] <= until
    assert lease["lease_until"] == pytest.approx(first[0]["lease_until"] - 3600, abs=0.01)

    # Node 1 is lost and its lease closed: the budget pays for one node from now on, so the
    # lease moves forward; the lost node is not written to and keeps what it had.
    lost = controller.attempt.instances[1].instance_id
    controller.ledger.close_leases([lost], utcnow())
    controller.attempt.gone_ranks.add(1)
    third = controller.check_budget()
    lease = third[0]
    assert lease["renewed_at"] > second[0]["renewed_at"]
    until = controller.budget_buys_until(lease["renewed_at"])
    assert until - SLACK_S <= lease["lease_until"] <= until
    assert lease["lease_until"] > second[0]["lease_until"] + 4000
    assert lease["runtime_deadline"] == pytest.approx(deadline, abs=1e-3)
    assert third[1] == second[1]


def test_the_guard_reads_the_lease_where_the_controller_writes_it(
    tmp_path: Path, ledger: Ledger, cluster: Cluster
) -> None:
    """The node's guard, given the node's home and the job's key, finds the renewed lease as
    its own."""
    controller = Controller(tmp_path, ledger, cluster)
    controller.check_budget()
    path = home_expr(GuardLayout(JOB_ID).lease)
    written = json.loads(controller.attempt.read(f"cat {path}")[0])
    home = controller.attempt.read("echo $HOME")[0].strip()
    assert Path(home).is_dir(), f"node 0's home {home} is not visible here"
    terms = tmp_path / "terms.json"
    document = controller.parts.guards.terms(0.0).for_node(
        now=utcnow(), hourly_usd=PRICE, poweroff="true", home=home
    )
    terms.write_text(document)
    del written["signature"]
    assert guard.Guard(str(terms)).lease() == written


def test_under_a_team_cap_the_lease_ends_when_the_team_would_pass_it(
    tmp_path: Path, ledger: Ledger, cluster: Cluster
) -> None:
    """Another job of the ledger bills too: the nodes' lease ends when the team's spend this
    month, at every open lease's price together, would pass `budget.monthly_usd`, long before
    the job's own budget runs out."""
    settings = Settings(home=tmp_path, budget=BudgetSettings(monthly_usd=Decimal(4)))
    controller = Controller(tmp_path, ledger, cluster, settings)
    teammate = controller.launched + timedelta(seconds=400)
    ledger.add_job(
        Job(
            id="teammate", name="teammate", provider="local", nodes=1, gpus_per_node=1,
            spec_json="{}", spec_path="job.yaml", created_at=teammate, state="RUNNING",
        )
    )  # fmt: skip
    ledger.open_lease(
        Lease(
            job_id="teammate", cluster="teammate", provider="local", instance_id="i-teammate",
            rank=0, market="on-demand", instance_type="local", price_per_hour=Decimal("7.20"),
            launched_at=teammate,
        )
    )  # fmt: skip
    lease = controller.check_budget()[0]
    at = lease["renewed_at"]
    # the job: $1.00 over its 1000 s; the teammate: $1.20 over 600 s; $1.80 left of $4 at
    # $10.80/h together lasts 600 s from the check, less the stop's reserve
    spent = (
        2 * float(PRICE) * (at - controller.launched.timestamp())
        + 7.20 * (at - teammate.timestamp())
    ) / 3600
    until = at + (4 - spent) / (2 * float(PRICE) + 7.20) * 3600 - RESERVE_S
    assert until == pytest.approx(controller.launched.timestamp() + 1600 - RESERVE_S, abs=0.05)
    assert until - SLACK_S <= lease["lease_until"] <= until + SLACK_S
    own_budget_until = controller.budget_buys_until(at)
    assert lease["lease_until"] < own_budget_until - 8000
