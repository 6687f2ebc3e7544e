"""The dashboard served over real HTTP (uvicorn, a real SQLite ledger of every kind of job and
kept cluster): every page answers, the jobs page is `orch status` in its order, filters,
unknown and hostile ids, the read-only server's lack of any action, the token off loopback,
the Host check on loopback, and the guarded cancel form."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.config import Settings, load_settings
from orchestrator.control.process.machine_id import machine_id
from orchestrator.job_state import JobState
from orchestrator.ledger import measures, store
from orchestrator.ledger.clusters import Clusters
from orchestrator.ledger.controller_leases import ControllerLeases
from orchestrator.ledger.store import Ledger, make_engine
from orchestrator.ledger.view import LedgerView
from orchestrator.report import documents
from orchestrator.report.documents import status_list
from orchestrator.web.access import COOKIE, Access
from orchestrator.web.app import JOB_PANELS, Dashboard
from tests.support.dashboard_app import Served, served
from tests.support.in_process import isolated_home
from tests.support.ledger_rows import NOW, add_job, fill
from tests.support.waiting import wait_until

ROW = re.compile(r'<tr data-job-id="([^"]+)" data-state="([^"]+)">')


@pytest.fixture
def ledger_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Settings, Ledger]:
    isolated_home(tmp_path, monkeypatch)
    settings = load_settings()
    ledger = Ledger(make_engine(settings.db_path))
    fill(ledger, tmp_path / "store")
    for module in (documents, measures, store):
        monkeypatch.setattr(module, "utcnow", lambda: NOW)
    return settings, ledger


@pytest.fixture
def site(ledger_home: tuple[Settings, Ledger]) -> Iterator[Served]:
    settings, ledger = ledger_home
    with served(Dashboard(settings, ledger, Access("127.0.0.1", 0, None), now=lambda: NOW)) as s:
        yield s


def test_the_jobs_page_lists_what_orch_status_lists_in_its_order(
    site: Served, ledger_home: tuple[Settings, Ledger]
) -> None:
    settings, ledger = ledger_home
    with LedgerView.of_engine(ledger.engine) as view:
        expected, _ = status_list(view, settings.home, NOW)
    page = site.get("/")
    assert page.status == 200
    assert ROW.findall(page.body) == [(job["id"], job["state"]) for job in expected]
    assert "boom: CUDA out of memory" not in page.body  # reasons are on the job's page
    rows = site.get("/?part=rows")
    assert ROW.findall(rows.body) == ROW.findall(page.body) and "<html" not in rows.body
    api = site.get("/api/jobs")
    assert [job["id"] for job in json.loads(api.body)["jobs"]] == [job["id"] for job in expected]


def test_filters_narrow_the_list(site: Served) -> None:
    failed = ROW.findall(site.get("/?state=failed").body)
    assert failed == [("failed-1", "FAILED")]
    assert ROW.findall(site.get("/?name=KEPT").body) == [("kept-1", "SUCCEEDED")]
    assert ROW.findall(site.get("/?owner=nobody").body) == []
    assert "No job matches these filters" in site.get("/?owner=nobody").body


def test_every_job_page_answers_and_a_failed_job_says_why(site: Served) -> None:
    for job_id in ("done-1", "failed-1", "never-1", "kept-1", "run-1", "queued-1"):
        page = site.get(f"/jobs/{job_id}")
        assert page.status == 200, (job_id, page.body[:500])
        assert f'data-job="{job_id}"' in page.body
    failed = site.get("/jobs/failed-1").body
    assert 'id="reason"' in failed and "boom: CUDA out of memory (simulated)" in failed
    assert 'id="reason"' not in site.get("/jobs/done-1").body
    live = json.loads(site.get("/jobs/run-1/live").body)
    assert live["state"] == "RUNNING" and not live["final"]
    assert set(live["parts"]) == {"summary", "events", "checkpoints"}
    assert 'id="step">7<' in live["parts"]["summary"]


@pytest.mark.parametrize("path", ["/jobs/nope", "/jobs/..%2F..%2Fetc", "/jobs/nope/live",
                                  "/jobs/nope/log?node=0", "/api/jobs/nope"])  # fmt: skip
def test_an_unknown_or_hostile_job_id_is_not_found(site: Served, path: str) -> None:
    reply = site.get(path)
    assert reply.status == 404, reply.body[:300]
    assert "Traceback" not in reply.body


def test_ledger_text_is_shown_as_text_never_run(
    site: Served, ledger_home: tuple[Settings, Ledger]
) -> None:
    _, ledger = ledger_home
    hostile = '<script>alert("x")</script><img src=x onerror=alert(1)>'
    add_job(ledger, "odd-1", JobState.FAILED, 40, reason=hostile, owner=hostile)
    ledger.add_event("odd-1", "WARNING", hostile)
    for path in ("/", "/jobs/odd-1", "/?owner=" + "x"):
        body = site.get(path).body
        assert "<script>alert" not in body and "<img src=x" not in body, path
    page = site.get("/jobs/odd-1").body
    assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in page
    live = site.get("/jobs/odd-1/live").body
    assert "<script>alert" not in json.loads(live)["parts"]["events"]


def test_the_clusters_page_shows_fleets_their_machines_and_queue(
    site: Served, ledger_home: tuple[Settings, Ledger]
) -> None:
    from orchestrator.ledger.fleets import FleetBook, FleetWaiter
    from tests.unit.ledger.test_fleet_book import fleet, host

    _, ledger = ledger_home
    book = FleetBook(ledger)
    book.add(fleet(), [host("10.0.0.1"), host("10.0.0.3", gpus=0, cpus=4)])
    book.wait(FleetWaiter(job_id="never-1", fleet="lab", nodes=1, slots_per_node=2,
                          owner="ana", since=NOW))  # fmt: skip
    page = site.get("/clusters")
    assert page.status == 200, page.body[:400]
    section = page.body[page.body.index('data-fleet="lab"') :]
    assert "root@10.0.0.1" in section and "4 CPU slots" in section
    assert "$2.50 per host-hour" in section
    assert 'href="/jobs/never-1"' in section  # the queue
    listed = site.get("/").body  # and the jobs page says where it waits
    assert "1 of 1 on lab" in listed


def test_other_pages_answer(site: Served) -> None:
    clusters = site.get("/clusters")
    assert clusters.status == 200
    for name in ("idle", "busy", "gone"):
        assert f'data-cluster="{name}"' in clusters.body
    assert site.get("/static/dashboard.css").status == 200
    assert site.get("/healthz").body == "ok"
    cost = site.get("/cost")
    assert cost.status == 200 and 'id="owners"' in cost.body and 'id="job-costs"' in cost.body
    for path in ("/cost/charts/burndown.svg", "/cost/charts/daily.svg",
                 *(f"/jobs/done-1/charts/{panel}.svg" for panel in JOB_PANELS)):  # fmt: skip
        chart = site.get(path)
        assert chart.status == 200 and chart.headers["content-type"] == "image/svg+xml", path
        assert chart.body.lstrip().startswith("<?xml") and "<svg" in chart.body
    assert site.get("/jobs/done-1/charts/secrets.svg").status == 404
    assert site.get("/cost/charts/x.svg").status == 404


def test_the_read_only_dashboard_has_no_action(site: Served, ledger_home: tuple) -> None:
    _, ledger = ledger_home
    for path in ("/", "/jobs/run-1", "/jobs/failed-1", "/clusters"):
        body = site.get(path).body
        assert 'method="post"' not in body.lower() and "cancel-form" not in body
    for path in ("/jobs/run-1/cancel", "/clusters/busy/down", "/jobs/run-1"):
        reply = site.request("POST", path, body="", headers={"Origin": site.url})
        assert reply.status in (404, 405), (path, reply.status)
    assert ledger.get_job("run-1").state == "RUNNING"


def test_a_loopback_dashboard_refuses_other_host_names(site: Served) -> None:
    assert site.get("/", headers={"Host": "rebound.example:80"}).status == 421
    assert site.get("/", headers={"Host": "localhost"}).status == 200


def test_off_loopback_every_page_needs_the_token(ledger_home: tuple[Settings, Ledger]) -> None:
    settings, ledger = ledger_home
    token = "k" * 43
    with served(Dashboard(settings, ledger, Access("0.0.0.0", 0, token))) as site:
        for path in ("/", "/jobs/run-1", "/api/jobs", "/cost", "/static/dashboard.css"):
            refused = site.get(path)
            assert refused.status == 401 and "run-1" not in refused.body
        assert site.get("/", headers={"Authorization": "Bearer " + "x" * 43}).status == 401
        assert site.get("/", headers={"Authorization": f"Bearer {token}"}).status == 200
        assert site.get("/healthz").status == 200
        first = site.get(f"/jobs/run-1?token={token}")
        assert first.status == 303 and first.headers["location"] == "/jobs/run-1"
        cookie = first.headers["set-cookie"]
        assert f"{COOKIE}={token}" in cookie and "HttpOnly" in cookie and "strict" in cookie.lower()
        page = site.get("/jobs/run-1", headers={"Cookie": f"{COOKIE}={token}"})
        assert page.status == 200 and 'data-job="run-1"' in page.body


def test_cancel_is_a_guarded_form_for_jobs_this_machine_drives(
    ledger_home: tuple[Settings, Ledger],
) -> None:
    settings, ledger = ledger_home
    access = Access("127.0.0.1", 0, None)
    with served(Dashboard(settings, ledger, access, allow_actions=True, now=lambda: NOW)) as site:
        add_job(ledger, "mine-1", JobState.PENDING, 30, owner=settings.owner_label)
        page = site.get("/jobs/mine-1").body
        assert 'id="cancel-form"' in page and access.csrf in page
        assert 'id="cancel-form"' not in site.get("/jobs/never-1").body  # not provably ours
        assert 'id="cancel-form"' not in site.get("/jobs/done-1").body  # ended: nothing to do
        form = {"Content-Type": "application/x-www-form-urlencoded", "Origin": site.url,
                "Host": site.url.removeprefix("http://")}  # fmt: skip
        assert site.request("POST", "/jobs/never-1/cancel", body="csrf=wrong",
                            headers=form).status == 403  # fmt: skip
        elsewhere = {**form, "Origin": "http://evil.example"}
        assert site.request("POST", "/jobs/never-1/cancel", body=f"csrf={access.csrf}",
                            headers=elsewhere).status == 403  # fmt: skip
        assert site.request("POST", "/jobs/done-1/cancel", body=f"csrf={access.csrf}",
                            headers=form).status == 409  # fmt: skip
        # a job whose controller lease another machine holds is that machine's to cancel
        ControllerLeases(ledger).take("queued-1", "pid-1", "another-machine", length_s=3600)
        assert site.request("POST", "/jobs/queued-1/cancel", body=f"csrf={access.csrf}",
                            headers=form).status == 403  # fmt: skip
        assert ledger.get_job("queued-1").state == "PENDING"
        # never-1 has no owner label (an older orch's): not provably this user's
        assert site.request("POST", "/jobs/never-1/cancel", body=f"csrf={access.csrf}",
                            headers=form).status == 403  # fmt: skip
        accepted = site.request("POST", "/jobs/mine-1/cancel", body=f"csrf={access.csrf}",
                                headers=form)  # fmt: skip
        assert (
            accepted.status == 303 and accepted.headers["location"] == "/jobs/mine-1?asked=cancel"
        )
        # what ran is `orch cancel mine-1` of this ORCH_HOME, which ends the pending job
        wait_until(lambda: ledger.get_job("mine-1").state == "CANCELLED", "the cancel", 60)
        log = settings.home / "dashboard" / "actions" / "cancel-mine-1.log"
        assert log.is_file()


def test_down_is_offered_and_done_only_for_clusters_this_machine_made(
    ledger_home: tuple[Settings, Ledger],
) -> None:
    settings, ledger = ledger_home
    here = machine_id(settings.home)
    mine = Clusters(ledger).create("mine", provider="local", nodes=1, gpus_per_node=1,
                                   autostop_s=None, now=NOW, machine=here)  # fmt: skip
    access = Access("127.0.0.1", 0, None)
    with served(Dashboard(settings, ledger, access, allow_actions=True, now=lambda: NOW)) as site:
        page = site.get("/clusters").body
        assert 'action="/clusters/mine/down"' in page
        assert 'action="/clusters/idle/down"' not in page  # made by no machine of ours
        form = {"Content-Type": "application/x-www-form-urlencoded", "Origin": site.url,
                "Host": site.url.removeprefix("http://")}  # fmt: skip
        body = f"csrf={access.csrf}"
        assert site.request("POST", "/clusters/idle/down", body=body, headers=form).status == 403
        assert site.request("POST", "/clusters/nope/down", body=body, headers=form).status == 404
        assert (
            site.request("POST", "/clusters/mine/down", body="csrf=x", headers=form).status == 403
        )
        assert Clusters(ledger).get(mine.id).state == "UP"
        done = site.request("POST", "/clusters/mine/down", body=body, headers=form)
        assert done.status == 303 and done.headers["location"] == "/clusters?asked=down"
        wait_until(lambda: Clusters(ledger).get(mine.id).state != "UP", "orch down mine", 60)
