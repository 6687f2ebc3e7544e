"""The controller host's rows in `orch status` and `orch cost` (`cli.host_jobs.host_rows`): a
host whose jobs were all seen finished is not asked again (a powered-off host costs no SSH
timeout), and one that does not answer is said, with its last answer shown. The host of these
tests listens nowhere (port 1 of 127.0.0.1), so any attempt to ask it fails at once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.cli.host_jobs import host_rows
from orchestrator.host import record as records
from orchestrator.host.listing import all_final
from orchestrator.host.record import HostRecord

HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIP7oPOVxsnYEqQ3uyTQl9ByBY7ENI6eA7QYyQSzAKaz6"
HOST = HostRecord(
    kind="launched", user="root", host="127.0.0.1", port=1, host_key=HOST_KEY,
    identity="/nonexistent/id", root="/x/.orch-host", autostop_s=0.0, version="0.1.0",
    installed_at="2026-12-06T09:00:00+00:00", instance_id="l-0123456789", provider="local",
    price_per_hour="0.36", launched_at="2026-12-06T09:00:00+00:00", jobs=["a-1", "b-2"],
)  # fmt: skip


def test_a_kept_answer_settles_the_jobs_only_when_each_is_final() -> None:
    rows = [{"id": "a-1", "state": "SUCCEEDED"}, {"id": "b-2", "state": "FAILED"}]
    assert all_final(rows, ["a-1", "b-2"])
    assert not all_final(rows, ["a-1", "b-2", "c-3"])  # submitted since the answer
    assert not all_final([*rows[:1], {"id": "b-2", "state": "RUNNING"}], ["a-1", "b-2"])
    assert not all_final([{"id": "a-1", "state": "SOMETHING-NEW"}], ["a-1"])


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ORCH_HOME", str(tmp_path))
    records.save(tmp_path, HOST)
    return tmp_path


def keep(home: Path, rows: list[dict]) -> None:
    path = records.host_dir(home) / "listing-status.json"
    path.write_text(json.dumps({"at": "2026-12-06T10:00:00+00:00", "jobs": rows}))


def test_finished_jobs_are_listed_from_the_kept_answer_without_asking_the_host(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [{"id": "a-1", "state": "SUCCEEDED"}, {"id": "b-2", "state": "CANCELLED"}]
    keep(home, rows)
    assert host_rows("status") == (rows, ["a-1", "b-2"], "root@127.0.0.1")
    assert capsys.readouterr().err == ""  # the host was not asked, so nothing failed


def test_a_host_that_does_not_answer_is_said_and_its_last_answer_shown(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert host_rows("status") is None  # no answer kept: its jobs are missing, and said so
    assert "its 2 job(s) are not listed" in capsys.readouterr().err

    rows = [{"id": "a-1", "state": "SUCCEEDED"}, {"id": "b-2", "state": "RUNNING"}]
    keep(home, rows)
    assert host_rows("status") == (rows, ["a-1", "b-2"], "root@127.0.0.1")
    said = capsys.readouterr().err
    assert "did not answer" in said and "as it listed them at 2026-12-06T10:00:00" in said
