"""A job that lives on a controller host which has gone (ended itself at its autostop, or cut
off): `orch status JOB` says that the host cannot be reached and how to find out why, instead
of pointing at the job's nodes."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from orchestrator.host import record as records
from orchestrator.remote.keys import ensure_identity
from tests.support.dashboard_run import free_port
from tests.support.helpers import orch_env, run_orch

JOB = "remote-counter-0156b9"


def test_status_of_a_job_on_a_host_that_is_gone_says_how_to_find_out_why(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    home = tmp_path / "orch"
    identity = ensure_identity(tmp_path / "keys", "host")
    records.save(
        home,
        records.HostRecord(
            kind="adopted", user="root", host="127.0.0.1", port=port,
            host_key=" ".join(identity.public_key.split()[:2]),
            identity=str(identity.private_key), root="/opt/orch-host", autostop_s=30.0,
            version="0.1.0", installed_at=datetime.now(UTC).isoformat(), jobs=[JOB],
        ),
    )  # fmt: skip
    shown = run_orch(["status", JOB], orch_env(home), timeout=120)
    assert shown.returncode != 0, shown.stdout
    said = " ".join(shown.stderr.split())
    assert f"cannot reach controller host at [127.0.0.1]:{port}" in said, shown.stderr
    assert "ended itself at its autostop" in said and "`orch controller status`" in said, said
    assert "shows the job's nodes" not in said, said
    # where the hint sends the user: the host's own document says it does not answer, and
    # does not send them on to itself
    asked = run_orch(["controller", "status", "--json"], orch_env(home), timeout=120)
    document = json.loads(asked.stdout)
    assert document["reachable"] is False and document["running"] is False, document
    assert document["error"].startswith("cannot reach controller host"), document
    assert "orch controller status" not in document["error"], document
