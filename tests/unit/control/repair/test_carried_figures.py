"""The figures a laptop keeps of a job that lives on a controller host (`control.repair.carried`):
read from the host's `orch status JOB --json` answer (as the host's orch writes it, from a real
ledger), kept as JSON in the kit, and refused whole when anything is out of shape (the host
is untrusted: its answer is data)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest

from orchestrator.config import load_settings
from orchestrator.control.repair.carried import MAX_LEASES, from_json, from_status
from orchestrator.ledger.store import Job, Lease, Ledger
from orchestrator.report.documents import job_document

JOB = "train-3f9c1a"
T0 = datetime(2026, 12, 6, 2, 0, tzinfo=UTC)


def host_answer(tmp_path: Path, ledger: Ledger) -> dict:
    """The host's answer for a job that ran on i-0 until T0+1h, and on i-1 since."""
    ledger.add_job(
        Job(id=JOB, name="train", provider="aws", nodes=1, gpus_per_node=1, spec_json="{}",
            spec_path="job.yaml", created_at=T0, started_at=T0, recoveries=1)
    )  # fmt: skip
    for iid, launched, ended in (
        ("i-0", T0 - timedelta(minutes=1), T0 + timedelta(hours=1)),
        ("i-1", T0 + timedelta(hours=1, minutes=2), None),
    ):
        ledger.open_lease(
            Lease(job_id=JOB, cluster=f"{JOB}-a1", provider="aws", instance_id=iid, rank=0,
                  market="spot", instance_type="g5.xlarge", price_per_hour=Decimal("1.0123"),
                  launched_at=launched, ended_at=ended)
        )  # fmt: skip
    settings = load_settings({"ORCH_HOME": str(tmp_path / "host")})
    return json.loads(json.dumps(job_document(ledger, settings, ledger.get_job(JOB))))


def test_the_hosts_answer_gives_the_start_recoveries_and_every_lease(
    tmp_path: Path, ledger: Ledger
) -> None:
    as_of = T0 + timedelta(hours=2)
    figures = from_status(host_answer(tmp_path, ledger), job_id=JOB, as_of=as_of)
    assert figures.started_at == T0 and figures.recoveries == 1
    assert [(c.instance_id, c.cluster, c.ended_at) for c in figures.leases] == [
        ("i-0", f"{JOB}-a1", T0 + timedelta(hours=1)), ("i-1", f"{JOB}-a1", None),
    ]  # fmt: skip
    assert figures.leases[0].price_per_hour == Decimal("1.0123")
    assert abs(figures.spend() - Decimal("1.0123") * 119 / 60) < Decimal("1e-9")
    assert from_json(figures.to_json(), JOB) == figures


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (lambda d: d.update(id="other-000000"), "not job"),
        (lambda d: d.update(leases="none"), "not a list"),
        (lambda d: d.update(started_at="2999-01-01T00:00:00+00:00"), "later than"),
        (lambda d: d.update(started_at="2026-12-06T02:00:00"), "no time zone"),
        (lambda d: d.update(recoveries=-1), "recoveries"),
        (lambda d: d["leases"][0].update(price_per_hour=float("nan")), "not finite"),
        (lambda d: d["leases"][0].update(price_per_hour=-1), "price is not from 0"),
        (lambda d: d["leases"][0].update(price_per_hour=True), "not a number"),
        (lambda d: d["leases"][0].update(market="reserved"), "market"),
        (lambda d: d["leases"][0].update(instance_id="i-\x1b[2J"), "control characters"),
        (lambda d: d["leases"][0].update(instance_id="i" * 201), "1 to 200"),
        (lambda d: d["leases"][1].update(instance_id="i-0"), "twice"),
        (lambda d: d["leases"][0].update(ended_at="2026-12-06T01:00:00+00:00"), "before its"),
        (lambda d: d.update(leases=d["leases"] * (MAX_LEASES // 2 + 1)), "more than"),
    ],
)
def test_an_answer_out_of_shape_is_refused_whole(
    tmp_path: Path, ledger: Ledger, change: object, why: str
) -> None:
    answer = host_answer(tmp_path, ledger)
    change(answer)  # type: ignore[operator]
    with pytest.raises(ValueError, match=why):
        from_status(answer, job_id=JOB, as_of=T0 + timedelta(hours=2))


def test_kept_figures_nested_past_the_parsers_depth_are_refused() -> None:
    with pytest.raises(ValueError, match="nested too deep"):
        from_json("[" * 200_000, JOB)
    with pytest.raises(ValueError, match="not a JSON object"):
        from_json("[]", JOB)
