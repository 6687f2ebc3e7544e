"""A machine id per ORCH_HOME (the `machine` of controller leases), the lease settings, and what
a shared ledger keeps of a job's env."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from orchestrator.config import load_settings
from orchestrator.control.process.machine_id import holder_id, machine_id, machine_of
from orchestrator.errors import ConfigError
from orchestrator.ledger.sharing import ENV_NOT_SHARED, names_only, shown_env


def test_a_machine_id_is_made_once_and_kept(tmp_path: Path) -> None:
    home = tmp_path / "orch"
    with ThreadPoolExecutor(8) as pool:
        ids = set(pool.map(lambda _: machine_id(home), range(16)))
    assert len(ids) == 1
    (made,) = ids
    assert (home / "machine-id").read_text().strip() == made
    assert machine_id(home) == made != machine_id(tmp_path / "other")
    assert sorted(p.name for p in home.iterdir()) == ["machine-id"]  # no temporary file left
    assert machine_of(holder_id(made, 42)) == made and holder_id(made, 42).endswith(":42")


def test_lease_settings_have_defaults_and_a_renewal_must_fit_twice_in_a_lease(
    tmp_path: Path,
) -> None:
    settings = load_settings({"ORCH_HOME": str(tmp_path)})
    assert not settings.ledger.shared and settings.local_root == tmp_path / "local"
    assert (settings.ledger.controller_lease, settings.ledger.lease_renewal) == (30.0, 10.0)
    shared = load_settings(
        {"ORCH_HOME": str(tmp_path), "ORCH_DATABASE_URL": "sqlite:////tmp/x.db",
         "ORCH_LOCAL_ROOT": str(tmp_path / "cloud")}
    )  # fmt: skip
    assert shared.ledger.shared and shared.local_root == tmp_path / "cloud"
    with pytest.raises(ConfigError, match="lease_renewal"):
        load_settings({"ORCH_HOME": str(tmp_path), "ORCH_LEASE_RENEWAL": "20"})


def test_a_shared_ledger_keeps_env_names_and_the_submitting_machine_shows_values(
    tmp_path: Path,
) -> None:
    stored = {"env": names_only({"RUN": "v1", "MODE": "fast"})}
    assert stored["env"] == {"RUN": ENV_NOT_SHARED, "MODE": ENV_NOT_SHARED}
    job_dir = tmp_path / "jobs" / "j"
    assert shown_env(stored, job_dir) == stored["env"]  # another machine: names only
    job_dir.mkdir(parents=True)
    (job_dir / "job.json").write_text(json.dumps({"spec": {"env": {"RUN": "v1", "MODE": "fast"}}}))
    assert shown_env(stored, job_dir) == {"RUN": "v1", "MODE": "fast"}
    assert shown_env({"env": {"A": "b"}}, tmp_path / "none") == {"A": "b"}  # not shared
