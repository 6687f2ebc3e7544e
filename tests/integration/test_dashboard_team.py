"""A team on one PostgreSQL ledger: each member's dashboard shows every member's jobs with their
owners and the month's spend per owner, and offers cancel only for the jobs the member's own
machine drives; the server refuses the others' whatever the form says."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from pathlib import Path

from orchestrator.config import Settings
from orchestrator.control.process.machine_id import machine_id
from orchestrator.job_state import JobState
from orchestrator.ledger.controller_leases import ControllerLeases
from orchestrator.ledger.store import Job, Lease, Ledger, make_engine, utcnow
from orchestrator.web.access import Access
from orchestrator.web.app import Dashboard
from tests.support.dashboard_app import served


def member(base: Path, name: str, url: str) -> Settings:
    return Settings(home=base / name, ledger={"url": url}, aws={"owner": name})


def test_each_member_sees_the_team_and_acts_only_on_their_own(
    tmp_path: Path, postgres_url: str
) -> None:
    ana, bo = member(tmp_path, "ana", postgres_url), member(tmp_path, "bo", postgres_url)
    ledger = Ledger(make_engine(postgres_url))
    now = utcnow()
    for i, (settings, job_id) in enumerate(((ana, "ana-job"), (bo, "bo-job"))):
        ledger.add_job(
            Job(id=job_id, name="train", state=JobState.RUNNING, provider="local", nodes=1,
                gpus_per_node=1, spec_json="{}", spec_path="job.yaml",
                created_at=now - timedelta(minutes=10 - i), owner=settings.owner_label)
        )  # fmt: skip
        ledger.open_lease(
            Lease(job_id=job_id, cluster=job_id, provider="local", instance_id=f"i-{job_id}",
                  rank=0, market="on-demand", instance_type="local",
                  price_per_hour=Decimal("3.60"), launched_at=now - timedelta(minutes=5))
        )  # fmt: skip
        ControllerLeases(ledger).take(job_id, "pid", machine_id(settings.home), length_s=3600)
    access = Access("127.0.0.1", 0, None)
    with served(
        Dashboard(ana, Ledger(make_engine(postgres_url)), access, allow_actions=True)
    ) as site:
        jobs = site.get("/").body
        assert 'data-job-id="bo-job"' in jobs and 'data-job-id="ana-job"' in jobs
        assert ">bo</td>" in jobs and ">ana</td>" in jobs
        only_bo = site.get("/?owner=bo").body
        assert 'data-job-id="bo-job"' in only_bo and 'data-job-id="ana-job"' not in only_bo
        assert 'id="cancel-form"' in site.get("/jobs/ana-job").body
        theirs = site.get("/jobs/bo-job").body
        assert 'id="cancel-form"' not in theirs and "Another machine drives this job" in theirs
        form = {"Content-Type": "application/x-www-form-urlencoded", "Origin": site.url,
                "Host": site.url.removeprefix("http://")}  # fmt: skip
        refused = site.request("POST", "/jobs/bo-job/cancel", body=f"csrf={access.csrf}",
                               headers=form)  # fmt: skip
        assert refused.status == 403 and "another machine" in refused.body
        assert ledger.get_job("bo-job").state == "RUNNING"
        cost = site.get("/cost").body
        owners = cost[cost.index('id="owners"') : cost.index("</table>", cost.index('id="owners"'))]
        assert "<td>ana</td>" in owners and "<td>bo</td>" in owners
