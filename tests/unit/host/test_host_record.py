"""This ORCH_HOME's record of its controller host (`orchestrator.host.record`), and the parts
of `orch controller status` computed from it here: the settings passed on to the host, a
launched host's spend, and a launched host that powered itself off (autostop)."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest

from orchestrator.config import load_settings
from orchestrator.errors import ControllerHostError
from orchestrator.host import record as records
from orchestrator.host.lifecycle import host_environment, powered_off_at, spend, status_document
from orchestrator.host.record import HostRecord

LAUNCHED = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
ADOPTED = HostRecord(
    kind="adopted", user="root", host="10.0.0.5", port=22, host_key="ssh-ed25519 AAAA",
    identity="/k/id", root="/root/.orch-host", autostop_s=600.0, version="0.1.0",
    installed_at=LAUNCHED.isoformat(),
)  # fmt: skip
IID = "l-0123456789"
LAUNCHED_HOST = dataclasses.replace(
    ADOPTED, kind="launched", instance_id=IID, provider="local", price_per_hour="0.36",
    launched_at=LAUNCHED.isoformat(),
)  # fmt: skip


def test_no_file_no_host(tmp_path: Path) -> None:
    assert records.load(tmp_path) is None
    with pytest.raises(ControllerHostError, match="no controller host"):
        records.require(tmp_path)


def test_save_load_add_job_forget(tmp_path: Path) -> None:
    records.save(tmp_path, LAUNCHED_HOST)
    assert json.loads((tmp_path / "controller-host/host.json").read_text())["format"] == 1
    assert records.load(tmp_path) == LAUNCHED_HOST
    records.add_job(tmp_path, "j-a00001")
    records.add_job(tmp_path, "j-a00002")
    records.add_job(tmp_path, "j-a00001")
    assert records.require(tmp_path).jobs == ["j-a00001", "j-a00002"]
    assert list((tmp_path / "controller-host").iterdir()) == [
        tmp_path / "controller-host/host.json"
    ], "a temporary file was left"
    records.forget(tmp_path)
    records.forget(tmp_path)
    assert records.load(tmp_path) is None


def test_a_damaged_record_is_refused_with_its_path(tmp_path: Path) -> None:
    (tmp_path / "controller-host").mkdir()
    (tmp_path / "controller-host/host.json").write_text("{not json")
    with pytest.raises(ControllerHostError, match="host.json"):
        records.load(tmp_path)


def test_the_host_gets_the_orch_settings_but_not_the_laptop_paths() -> None:
    environ = {"ORCH_HOME": "/laptop", "ORCH_LOCAL_ROOT": "/r", "ORCH_LOCAL_NETWORK": "namespace",
               "ORCH_LOCAL_SUBNET": "10.9.0.0/16", "ORCH_WATCH_INTERVAL": "1", "HOME": "/root",
               "AWS_SECRET_ACCESS_KEY": "x"}  # fmt: skip
    assert host_environment(environ) == {
        "ORCH_WATCH_INTERVAL": "1",
        "ORCH_LOCAL_NETWORK": "loopback",
    }


def test_spend_of_a_launched_host_and_none_for_an_adopted_one() -> None:
    assert spend(ADOPTED, LAUNCHED + timedelta(hours=1)) is None
    assert spend(LAUNCHED_HOST, LAUNCHED + timedelta(minutes=30)) == Decimal("0.180000")
    assert spend(LAUNCHED_HOST, LAUNCHED + timedelta(seconds=1)) == Decimal("0.000100")


def _power_off(home: Path, at: datetime) -> None:
    folder = home / "local/powered-off"
    folder.mkdir(parents=True)
    (folder / f"{IID}.json").write_text(json.dumps({"at": at.isoformat()}))


def test_a_launched_host_that_powered_itself_off_shows_when_billing_stopped(
    tmp_path: Path,
) -> None:
    settings = load_settings({"ORCH_HOME": str(tmp_path)})
    assert powered_off_at(settings, LAUNCHED_HOST) is None
    off = LAUNCHED + timedelta(minutes=30)
    _power_off(tmp_path, off)
    assert powered_off_at(settings, LAUNCHED_HOST) == off
    assert powered_off_at(settings, ADOPTED) is None, "an adopted host is never powered off"
    # No SSH is tried: the record's host does not exist, and it is not asked.
    document = status_document(settings, LAUNCHED_HOST)
    assert document["billing_stopped_at"] == off.isoformat()
    assert document["spend_usd"] == "0.180000", "spend went on after the poweroff"
    assert document["running"] is False and document["launched_at"] == LAUNCHED.isoformat()
