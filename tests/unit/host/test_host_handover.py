"""Pure and local parts of handing a dead controller host's jobs over: the kit's files and
their modes on this machine, the settings a loopback host gets so its jobs' nodes outlive it,
and how a dead launched host is told from a live one and retired."""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import os
import stat
import sys
import tarfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest

from orchestrator.config import load_settings
from orchestrator.errors import ControllerHostError
from orchestrator.host import handover, kit_archive
from orchestrator.host import record as records
from orchestrator.host.lifecycle import host_environment
from orchestrator.host.record import HostRecord
from orchestrator.host.replacement import hand_over_report, probe, retire, retire_dead

JOB = "j-0123ab"
IID = "l-0123456789"
HOST = HostRecord(
    kind="launched", user="root", host="127.0.0.1", port=1, host_key="ssh-ed25519 AAAA",
    identity="/k/id", root="/x/.orch-host", autostop_s=0.0, version="0.1.0",
    installed_at="2024-05-01T12:00:00+00:00", instance_id=IID, provider="local",
    price_per_hour="0.36", launched_at="2024-05-01T12:00:00+00:00", jobs=[JOB],
)  # fmt: skip


def _packed(files: dict[str, str]) -> str:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return base64.b64encode(buffer.getvalue()).decode()


def test_the_kit_holds_the_record_secrets_and_key_of_the_job() -> None:
    assert handover.kit_files(JOB) == [
        f"jobs/{JOB}/job.json",
        f"jobs/{JOB}/env.json",
        f"keys/{JOB}/id_ed25519",
        f"keys/{JOB}/id_ed25519.pub",
    ]


def _unpack(packed: str, home: Path) -> list[str]:
    return kit_archive.unpack(packed, handover.kit_dir(home, JOB), handover.kit_files(JOB))


def test_an_unpacked_kit_is_private_and_complete_only_with_every_file(tmp_path: Path) -> None:
    files = {name: "x" for name in handover.kit_files(JOB)}
    partial = {k: v for k, v in files.items() if not k.startswith("keys/")}
    _unpack(_packed(partial), tmp_path)
    assert not handover.complete(tmp_path, JOB)
    _unpack(_packed(files), tmp_path)
    assert handover.complete(tmp_path, JOB)
    for path in handover.kit_dir(tmp_path, JOB).rglob("*"):
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o700 if path.is_dir() else 0o600), (path, oct(mode))
    assert handover.kept_jobs(tmp_path) == [JOB]
    handover.forget_all(tmp_path)
    assert not (records.host_dir(tmp_path) / "kits").exists()
    assert handover.kept_jobs(tmp_path) == []


def test_a_kit_with_a_path_out_of_its_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ControllerHostError, match="refused"):
        _unpack(_packed({"../escaped": "x"}), tmp_path)
    assert not (records.host_dir(tmp_path) / "kits" / "escaped").exists()
    assert not list(tmp_path.rglob("escaped"))


def test_a_loopback_host_keeps_its_nodes_and_their_software_where_this_machine_does() -> None:
    environ = {"ORCH_HOME": "/laptop", "ORCH_LOCAL_ROOT": "/r", "ORCH_WATCH_INTERVAL": "1"}
    assert host_environment(environ, Path("/cloud")) == {
        "ORCH_WATCH_INTERVAL": "1",
        "ORCH_LOCAL_ROOT": "/cloud",
        "ORCH_LOCAL_NODE_VENV": sys.prefix,  # not the host's venv, which dies with it
        "ORCH_LOCAL_NETWORK": "loopback",
    }
    assert (
        host_environment({"ORCH_LOCAL_NODE_VENV": "/v"}, Path("/cloud"))["ORCH_LOCAL_NODE_VENV"]
        == "/v"
    )
    assert "ORCH_LOCAL_NODE_VENV" not in host_environment({})  # the host's own nodes


def test_local_nodes_run_the_venv_the_settings_name(tmp_path: Path) -> None:
    from orchestrator.providers.local.starting import node_venv_bin

    default = load_settings({"ORCH_HOME": str(tmp_path)})
    assert node_venv_bin(default) == Path(sys.prefix) / "bin"
    named = load_settings({"ORCH_HOME": str(tmp_path), "ORCH_LOCAL_NODE_VENV": "/opt/venv"})
    assert node_venv_bin(named) == Path("/opt/venv/bin")


def test_a_launched_host_whose_node_is_gone_is_dead_and_retired(tmp_path: Path) -> None:
    settings = load_settings({"ORCH_HOME": str(tmp_path)})
    health = probe(settings, HOST)
    assert not health.alive and health.reason == f"its node {IID} is gone"
    off = settings.local_root / "powered-off"
    off.mkdir(parents=True)
    at = datetime(2024, 5, 1, 13, 0, tzinfo=UTC)
    (off / f"{IID}.json").write_text(json.dumps({"at": at.isoformat()}))
    assert "powered off at 2024-05-01 13:00:00" in probe(settings, HOST).reason
    done = retire(settings, HOST)
    assert done["terminated"] == IID and done["billing_stopped_at"] == at.isoformat()


def test_a_host_whose_setup_never_finished_is_taken_for_dead(tmp_path: Path) -> None:
    settings = load_settings({"ORCH_HOME": str(tmp_path)})
    half = dataclasses.replace(HOST, kind="adopted", instance_id=None, root="")
    assert probe(settings, half).reason == "its setup by `orch controller up` never finished"


def test_a_dead_host_is_forgotten_before_a_new_one_comes_up(tmp_path: Path) -> None:
    settings = load_settings({"ORCH_HOME": str(tmp_path)})
    records.save(tmp_path, dataclasses.replace(HOST, jobs=[JOB]))
    health = probe(settings, HOST)
    done = retire_dead(settings, HOST, health)
    assert done["jobs"] == [JOB] and done["terminated"] == IID
    assert "is gone" in done["reason"]
    assert records.load(tmp_path) is None


def test_a_moved_kit_record_points_at_the_new_hosts_copy_and_keeps_its_time(
    tmp_path: Path,
) -> None:
    old, new = "/old/.orch-host/submissions/ab12", "/new/.orch-host/submissions/ab12"
    record = {
        "spec": {"workdir": f"{old}/work"}, "source": f"{old}/job.yaml",
        "workdir": f"{old}/work", "base_dir": old, "data_sources": [f"{old}/data/0"],
    }  # fmt: skip
    _unpack(_packed({f"jobs/{JOB}/job.json": json.dumps(record)}), tmp_path)
    path = handover.kit_dir(tmp_path, JOB) / f"jobs/{JOB}/job.json"
    submitted = datetime(2026, 12, 5, 22, 0, tzinfo=UTC).timestamp()
    os.utime(path, (submitted, submitted))
    assert handover.load_submission(tmp_path, JOB) is None
    handover.move_record(tmp_path, JOB, new)  # no submission kept: nothing to move
    assert json.loads(path.read_text()) == record

    kept = handover.Submission(old, "/laptop/work", ["/laptop/data.bin"])
    handover.save_submission(tmp_path, JOB, kept)
    assert handover.load_submission(tmp_path, JOB) == kept
    handover.move_record(tmp_path, JOB, new)

    moved = json.loads(path.read_text())
    assert moved["workdir"] == f"{new}/work" and moved["data_sources"] == [f"{new}/data/0"]
    assert moved["spec"]["workdir"] == f"{new}/work" and moved["base_dir"] == new
    assert path.stat().st_mtime == submitted  # a rebuilding host reads the submit time here
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert handover.load_submission(tmp_path, JOB) == dataclasses.replace(kept, folder=new)
    assert handover.kit_files(JOB) == [
        f"jobs/{JOB}/job.json", f"jobs/{JOB}/env.json",
        f"keys/{JOB}/id_ed25519", f"keys/{JOB}/id_ed25519.pub",
    ]  # the submission is never sent to a host  # fmt: skip


def test_files_gone_from_this_machine_are_said_and_nothing_is_sent(tmp_path: Path) -> None:
    no_host = cast(Any, None)  # nothing may be sent: any use of the session would fail
    assert handover.resend(no_host, tmp_path, JOB) == (
        "this ORCH_HOME kept no record of where its workdir is"
    )
    work = tmp_path / "work"
    work.mkdir()
    gone = tmp_path / "data.bin"
    handover.save_submission(
        tmp_path, JOB, handover.Submission("/h/submissions/ab12", str(work), [str(gone)])
    )
    assert handover.resend(no_host, tmp_path, JOB) == (
        f"its files are gone from this machine: {gone}"
    )


def test_a_bucket_source_is_kept_as_none_and_never_looked_for_here(tmp_path: Path) -> None:
    no_host = cast(Any, None)  # nothing may be sent: any use of the session would fail
    gone = tmp_path / "work"
    kept = handover.Submission("/h/submissions/ab12", str(gone), [None])
    handover.save_submission(tmp_path, JOB, kept)
    assert handover.load_submission(tmp_path, JOB) == kept
    assert handover.resend(no_host, tmp_path, JOB) == (
        f"its files are gone from this machine: {gone}"
    )


def test_a_job_rebuilt_and_ended_before_the_listing_is_said_rebuilt_and_ended() -> None:
    # Its nodes trained on while no host ran; the new host's controller adopted it, found it
    # done and ended it before the listing: it was rebuilt all the same.
    kinds = ["done", "live", "known", "gone", "no-kit"]
    report = hand_over_report(
        kinds,
        sent={"done", "live", "known", "gone"},
        rebuilt={
            "done": {"status": "rebuilt", "detail": "RUNNING on 2 node(s)"},
            "live": {"status": "rebuilt", "detail": "RUNNING on 2 node(s)"},
            "known": {"status": "known", "detail": "the ledger has it"},
            "gone": {"status": "lost", "detail": "none of its nodes runs"},
        },
        states={"done": "SUCCEEDED", "live": "RUNNING", "known": "RUNNING", "no-kit": "RUNNING"},
        notes=[],
    )
    assert report["rebuilt"] == ["done", "live"]
    assert report["ended"] == ["done"]
    assert report["handed_over"] == ["live", "known"]
    assert report["lost"] == {
        "gone": "none of its nodes runs",
        "no-kit": "this ORCH_HOME kept no hand-over kit of it",
    }
