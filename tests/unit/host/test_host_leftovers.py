"""What a controller host keeps of a job once it ended (`orchestrator.host.leftovers`): not its
secrets file, not its submission folder, and nothing outside its own root is ever removed; and
the settings the host gets (`lifecycle.host_config`): jobs there carry the laptop's owner."""

from __future__ import annotations

import json
import os
from pathlib import Path

from orchestrator.host import leftovers
from orchestrator.host.layout import HostLayout
from orchestrator.host.lifecycle import host_config

JOB, OTHER = "train-0a1b2c", "train-ffffff"
TOKEN = "0123456789ab"


def host_with_job(tmp_path: Path, job_id: str, base_dir: str) -> HostLayout:
    """A host root whose ORCH_HOME holds the record and secrets file of `job_id`."""
    layout = HostLayout(str(tmp_path / ".orch-host"))
    job = Path(layout.home) / "jobs" / job_id
    job.mkdir(parents=True, exist_ok=True)
    (job / "job.json").write_text(json.dumps({"base_dir": base_dir, "workdir": "w"}))
    (job / "env.json").write_text('{"secrets": {"TOKEN": "v"}}')
    return layout


NOW = 1_000_000.0


def submission(layout: HostLayout, token: str, age_s: float = 0.0) -> Path:
    """A submission folder made `age_s` before `NOW`."""
    folder = Path(layout.submission(token))
    (folder / "work").mkdir(parents=True)
    (folder / "work" / "train.py").write_text("print()")
    os.utime(folder, (NOW - age_s, NOW - age_s))
    return folder


def test_an_ended_job_leaves_no_secrets_file_and_no_submission(tmp_path: Path) -> None:
    layout = host_with_job(tmp_path, JOB, str(tmp_path / ".orch-host/submissions" / TOKEN))
    folder = submission(layout, TOKEN)
    removed = leftovers.clear_ended(layout, [JOB])
    assert removed == [f"{layout.home}/jobs/{JOB}/env.json", str(folder)]
    assert not folder.exists() and not Path(removed[0]).exists()
    assert (Path(layout.home) / "jobs" / JOB / "job.json").exists()  # the record stays
    assert leftovers.clear_ended(layout, [JOB]) == []


def test_a_record_pointing_outside_the_hosts_submissions_removes_nothing_there(
    tmp_path: Path,
) -> None:
    precious = tmp_path / "precious"
    precious.mkdir()
    for base in (str(precious), f"{tmp_path}/.orch-host/submissions/../../precious",
                 f"{tmp_path}/.orch-host/submissions/not-a-token"):  # fmt: skip
        layout = host_with_job(tmp_path, JOB, base)
        assert leftovers.submission_of(layout, JOB) is None
        leftovers.clear_ended(layout, [JOB, "../../precious"])
    assert precious.is_dir()


def test_a_submission_no_job_took_goes_once_old_and_a_running_jobs_stays(
    tmp_path: Path,
) -> None:
    layout = host_with_job(tmp_path, JOB, str(tmp_path / ".orch-host/submissions" / TOKEN))
    running = submission(layout, TOKEN, age_s=2 * leftovers.ORPHAN_AGE_S)
    young = submission(layout, "aaaaaaaaaaaa", age_s=leftovers.ORPHAN_AGE_S - 1)
    orphan = submission(layout, "bbbbbbbbbbbb", age_s=leftovers.ORPHAN_AGE_S + 1)
    assert leftovers.clear_orphans(layout, [JOB], now=NOW) == [str(orphan)]
    assert not orphan.exists() and running.is_dir() and young.is_dir()
    assert leftovers.clear_orphans(layout, [], now=NOW) == [str(running)]  # its job ended
    assert leftovers.clear_orphans(HostLayout(str(tmp_path / "none")), [], now=0.0) == []


def test_the_host_gets_the_laptops_settings_with_the_laptops_owner() -> None:
    laptop = {"ledger": {"url": "postgresql://db/orch"}, "aws": {"regions": ["us-east-1"]}}
    assert host_config(laptop, "alice") == {
        "ledger": {"url": "postgresql://db/orch"},
        "aws": {"regions": ["us-east-1"], "owner": "alice"},
    }
    assert host_config({}, "alice") == {"aws": {"owner": "alice"}}
    assert laptop["aws"] == {"regions": ["us-east-1"]}, "the input changed"
