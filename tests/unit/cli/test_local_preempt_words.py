"""`orch local preempt --notice` of a node that the job ended itself during the notice says so in
plain words. The real `orch local preempt` entry point in this process, on a real ledger; the
local provider is a stand-in whose reclaim finds the node already ended (as `local_spot.reclaim`
reports it), since the real sequence needs a running job on real nodes."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest

from orchestrator.cli import local as local_cli
from orchestrator.job_state import JobState
from orchestrator.ledger.store import Ledger, make_engine
from orchestrator.providers.base import Instance
from tests.support.in_process import isolated_home, run_main
from tests.support.ledger_rows import add_job

NODE = Instance(
    instance_id="local-n1", job_id="spot-1", cluster="spot-1", rank=1, private_ip="10.0.0.2",
    ssh_host="127.0.0.1", ssh_port=2222, ssh_user="orch", host_key="", interface="lo",
    market="spot", instance_type="local-1x", price_per_hour=Decimal("0.3"),
    launched_at=datetime(2026, 12, 6, tzinfo=UTC),
)  # fmt: skip


class EndedDuringNotice:
    def list_owned(self, *, job_id: str | None = None) -> list[Instance]:
        return [NODE]

    def reclaim(self, instance_id: str, notice_s: float = 0.0) -> datetime | None:
        return None  # its owner terminated it while the notice was served


def test_a_node_the_job_ended_during_the_notice_is_said_to_be_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = isolated_home(tmp_path, monkeypatch)
    monkeypatch.setenv("COLUMNS", "300")
    add_job(Ledger(make_engine(home / "orch.db")), "spot-1", JobState.SUCCEEDED, 0)
    monkeypatch.setattr(local_cli, "_provider", lambda settings: EndedDuringNotice())
    code, out, err = run_main(["local", "preempt", "spot-1", "--node", "1", "--notice", "5"])
    assert code == 0, out + err
    assert "let go" not in out
    assert "node 1 (local-n1) was not reclaimed: orch ended it during the 5 s notice" in out, out
    assert "`orch status spot-1` shows what the job did" in out, out
