"""Many machines, one ledger: two ORCH_HOMEs (two machines to the ledger, each with its own
machine id) share one ledger, a `sqlite:///` URL or a PostgreSQL database, and one local
"cloud" (`local.root`, as two machines share an AWS account). Real local nodes and controllers.

They see each other's jobs; the env values and secrets of a job never reach the database; a
controller killed on one home is left alone by the other while its lease runs, reported (never
touched) once it expired while the other home lacks the job's keys, and adopted by the other
home's next `orch status` once it has them; of two controllers started at once for one job
exactly one drives; a controller whose lease was taken stops at once and leaves the nodes as
they were; and reconcile on the other home never ends a job's nodes it does not drive.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta

from sqlalchemy import inspect, text

from orchestrator.ledger.controller_leases import ControllerLeases
from orchestrator.ledger.store import utcnow
from tests.support.helpers import REPO
from tests.support.lease_rows import age_lease
from tests.support.shared_homes import (
    ENV_VALUE,
    LEASE_S,
    SECRET_VALUE,
    Shared,
    assert_nodes_alive,
    detach,
    hand_over,
    kill_controller,
    lease_expired,
    lease_machine,
    open_instances,
    state,
    wait_for_state,
)
from tests.support.waiting import wait_until


def test_two_homes_see_each_others_jobs_and_no_env_value_or_secret_reaches_the_ledger(
    shared: Shared,
) -> None:
    from_a, from_b = detach(shared.a, shared.spec), detach(shared.b, shared.spec)
    assert shared.a.id != shared.b.id
    for machine in (shared.a, shared.b):
        listed = machine.orch("status", "--json")
        assert listed.returncode == 0, listed.stderr
        assert {from_a, from_b} <= {job["id"] for job in json.loads(listed.stdout)["jobs"]}
    cost = shared.b.orch("cost", "--json")
    assert cost.returncode == 0 and from_a in cost.stdout and from_b in cost.stdout
    # env values: on the submitting machine only; the names everywhere
    shown_a = json.loads(shared.a.orch("status", from_a, "--json").stdout)
    shown_b = json.loads(shared.b.orch("status", from_a, "--json").stdout)
    assert shown_a["env"] == {"RUN_LABEL": ENV_VALUE} and shown_a["secrets"] == ["API_TOKEN"]
    assert list(shown_b["env"]) == ["RUN_LABEL"] and ENV_VALUE not in json.dumps(shown_b)
    wait_for_state(shared, from_a, "RUNNING", "SUCCEEDED")
    # every text column of every table, once the job runs (and has written its events)
    engine = shared.ledger.engine
    with engine.connect() as connection:
        for table in inspect(engine).get_table_names():
            rows = connection.execute(text(f'SELECT * FROM "{table}"')).all()
            for row in rows:
                for value in row:
                    if isinstance(value, str):
                        assert ENV_VALUE not in value and SECRET_VALUE not in value, (table, row)
    # and the controller had them all the same: the nodes' environment holds both
    job_dir = shared.a.home / "jobs" / from_a
    assert SECRET_VALUE in (job_dir / "env.json").read_text()
    assert ENV_VALUE in (job_dir / "job.json").read_text()


def test_a_killed_controller_is_reported_elsewhere_and_adopted_only_with_the_keys(
    shared: Shared,
) -> None:
    a, b = shared.a, shared.b
    job_id = detach(a, shared.spec)
    wait_for_state(shared, job_id, "RUNNING")
    nodes = open_instances(shared, job_id)
    # live on a: b's reconcile and status leave it alone
    reconciled = b.orch("reconcile", "--json")
    assert reconciled.returncode == 0, reconciled.stderr
    report = json.loads(reconciled.stdout)
    assert report["terminated"] == {} and report["live_elsewhere"] == [job_id]
    downed = b.orch("down", "--all")  # nor does b's `orch down --all`
    assert downed.returncode == 0, downed.stderr
    assert f"{job_id}: another machine drives it" in " ".join(downed.stdout.split())
    assert open_instances(shared, job_id) == nodes

    kill_controller(a, job_id)
    # While its lease runs, nothing is said and nothing done. The lease is held open for this
    # look (a loaded machine's process start can outlast the test's 3 s lease), then left to
    # run out on its own.
    age_lease(shared.ledger, job_id, 0, length_s=60)
    status = b.orch("status")
    assert status.returncode == 0 and "stopped" not in status.stderr
    age_lease(shared.ledger, job_id, 0, length_s=LEASE_S)
    lease_expired(shared, job_id)
    status = b.orch("status")
    assert (
        f"job {job_id}: its controller on machine {a.id} stopped; run `orch reconcile` on "
        f"{a.id}, which holds its keys"
    ) in " ".join(status.stderr.split())
    report = json.loads(b.orch("reconcile", "--json").stdout)
    assert report["terminated"] == {} and report["stranded"] == [job_id]
    assert not (b.home / "jobs" / job_id / "controller.lock").exists()
    assert open_instances(shared, job_id) == nodes
    assert_nodes_alive(nodes)

    hand_over(job_id, a, b)
    status = b.orch("status")
    assert f"the controller of {job_id} was gone; a new one adopted the job" in status.stderr
    wait_until(lambda: lease_machine(shared, job_id) == b.id, "b's controller to hold the lease",
               20, interval=0.2)  # fmt: skip
    assert "adopted" not in a.orch("status").stderr  # a leaves it to b
    wait_for_state(shared, job_id, "SUCCEEDED", timeout=60)
    assert [lease.instance_id for lease in shared.ledger.leases(job_id)] == nodes  # no relaunch
    kinds = [event.kind for event in shared.ledger.events(job_id)]
    assert "LEASE_TAKEN_OVER" in kinds
    assert open_instances(shared, job_id) == []


def test_one_of_two_racing_controllers_drives_and_a_controller_whose_lease_is_taken_stops(
    shared: Shared,
) -> None:
    a, b = shared.a, shared.b
    job_id = detach(a, shared.spec)
    wait_for_state(shared, job_id, "RUNNING")
    nodes = open_instances(shared, job_id)
    kill_controller(a, job_id)
    hand_over(job_id, a, b)
    lease_expired(shared, job_id)
    # two controllers at once, one per home, for the one job
    racers = [
        subprocess.Popen(
            [sys.executable, "-m", "orchestrator.control.daemon", job_id],
            env=m.env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        for m in (a, b)
    ]
    loser = wait_until(
        lambda: next((r for r in racers if r.poll() is not None), None), "one to give up", 20
    )
    winner = racers[1 - racers.index(loser)]
    assert loser.returncode == 0 and "its lease is held by" in (loser.stdout.read() or "")
    assert winner.poll() is None
    held = ControllerLeases(shared.ledger).get(job_id)
    assert held is not None and held.holder.endswith(f":{winner.pid}")

    # someone else takes the lease: the winner stops at once, the nodes as they were
    with shared.ledger.engine.begin() as connection:
        connection.execute(
            text("UPDATE controller_lease SET holder = 'thief:1', machine = 'thief', "
                 "expires_at = :until WHERE job_id = :job"),
            {"until": _stored(shared, utcnow() + timedelta(seconds=LEASE_S)), "job": job_id},
        )  # fmt: skip
    assert winner.wait(timeout=10) == 1
    lost = [e for e in shared.ledger.events(job_id) if e.kind == "LEASE_LOST"]
    assert len(lost) == 1 and "thief:1" in lost[0].message
    assert state(shared, job_id) == "RUNNING" and open_instances(shared, job_id) == nodes
    assert_nodes_alive(nodes)

    # the thief never renews: once its lease expired, a's reconcile adopts and finishes the job
    lease_expired(shared, job_id)
    report = json.loads(a.orch("reconcile", "--json").stdout)
    assert report["revived"] == [job_id] and report["terminated"] == {}
    wait_for_state(shared, job_id, "SUCCEEDED", timeout=60)
    assert [lease.instance_id for lease in shared.ledger.leases(job_id)] == nodes


def _stored(shared: Shared, when: object) -> object:
    """`when` as the lease table stores it (ISO text on SQLite, a timestamp on PostgreSQL)."""
    if shared.url.startswith("sqlite"):
        return when.isoformat()  # type: ignore[attr-defined]
    return when
