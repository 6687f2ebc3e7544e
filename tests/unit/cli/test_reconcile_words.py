"""`orch reconcile` with nothing running says there are no nodes, not that every node has a
job. Through the console entry point, in this process, on a fresh ORCH_HOME (the local
provider, asked for its nodes, has none)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.in_process import isolated_home, run_main


def test_no_nodes_is_said_as_such(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    isolated_home(tmp_path, monkeypatch)
    code, out, err = run_main(["reconcile"])
    assert code == 0, out + err
    assert out.strip() == "nothing to reconcile: no nodes of this ledger are running"
    code, out, err = run_main(["reconcile", "--json"])
    assert code == 0 and json.loads(out)["nodes"] == 0, out + err
