"""`orch reconcile` racing a teammate's submit on a shared ledger: the teammate's job is
registered and its node launched while reconcile runs, at the moment its provider is asked
for the nodes (a hook on the real local provider, so the order is the same every run). The
node is listed, and its job must be known as the teammate's: neither reconcile nor
`orch down --all` ever ends it. Real
local nodes and controllers, two ORCH_HOMEs on one SQLite ledger."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config import load_settings
from orchestrator.control.repair.reconcile import reconcile
from orchestrator.control.verbs import commands
from orchestrator.providers.base import Instance
from orchestrator.providers.local.provider import LocalProvider
from tests.support.shared_homes import (
    Shared,
    assert_nodes_alive,
    detach,
    open_instances,
    shared_homes,
    state,
)
from tests.support.waiting import wait_until


class SubmitWhileListing(LocalProvider):
    """The local provider, where a teammate submits a job (and its node launches) just
    before the first listing of every node is read."""

    def __init__(self, shared: Shared) -> None:
        super().__init__(load_settings(shared.a.env))
        self.shared = shared
        self.submitted: str | None = None

    def list_owned(self, job_id: str | None = None) -> list[Instance]:
        if job_id is None and self.submitted is None:
            self.submitted = detach(self.shared.b, self.shared.spec)
            wait_until(
                lambda: open_instances(self.shared, self.submitted or ""),
                "the teammate's node", 60, interval=0.2,
            )  # fmt: skip
        return super().list_owned(job_id=job_id)


def test_reconcile_never_ends_the_node_of_a_job_a_teammate_submits_meanwhile(
    tmp_path: Path,
) -> None:
    with shared_homes(f"sqlite:///{tmp_path / 'shared.db'}", tmp_path) as shared:
        provider = SubmitWhileListing(shared)
        report = reconcile(load_settings(shared.a.env), shared.ledger, [provider])
        theirs = provider.submitted
        assert theirs is not None
        nodes = open_instances(shared, theirs)
        assert report.terminated == {}, report
        assert theirs in report.live_elsewhere
        assert_nodes_alive(nodes)
        assert state(shared, theirs) not in {"RECOVERING", "FAILED", "CANCELLED"}
        assert open_instances(shared, theirs) == nodes
        assert [e.kind for e in shared.ledger.events(theirs)].count("TERMINATED") == 0


def test_down_all_never_ends_the_node_of_a_job_a_teammate_submits_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with shared_homes(f"sqlite:///{tmp_path / 'shared.db'}", tmp_path) as shared:
        provider = SubmitWhileListing(shared)
        monkeypatch.setattr(commands, "providers_in_use", lambda _settings, _ledger: [provider])
        result = commands.down(load_settings(shared.a.env), shared.ledger, None)
        theirs = provider.submitted
        assert theirs is not None
        nodes = open_instances(shared, theirs)
        assert result.ended == (), result
        assert theirs in result.elsewhere
        assert_nodes_alive(nodes)
        assert open_instances(shared, theirs) == nodes
