"""`orch ssh NAME -- COMMAND` on a real local node hands COMMAND to the node's shell as
OpenSSH's `ssh HOST COMMAND` does: the words joined by spaces, so a quoted command line with
`;`, pipes and expansions runs whole, and its exit status is orch's. The node is a kept
cluster's (`dev`), launched with the cluster's own key; `orch` runs as its own process."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config import LocalSettings, Settings
from orchestrator.ledger.store import Ledger, make_engine
from tests.support.helpers import orch_env, run_orch
from tests.support.kept_node import launch_kept_node

pytestmark = [pytest.mark.timeout(120)]


def test_a_command_line_runs_whole_in_the_node_s_shell(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "orch", local=LocalSettings(network="loopback"))  # type: ignore[arg-type]
    ledger = Ledger(make_engine(settings.db_path))
    _, provider, _ = launch_kept_node(settings, ledger)
    env = orch_env(settings.home, ORCH_LOCAL_NETWORK="loopback")
    try:
        both = run_orch(["ssh", "dev", "--", "echo a; echo b"], env, timeout=60)
        assert (both.returncode, both.stdout) == (0, "a\nb\n"), both.stderr
        # Separate words are one command line too: the pipe and the expansion are the shell's.
        words = run_orch(["ssh", "dev", "--", "echo", "$((6 * 7))", "|", "tr", "4", "x"], env)
        assert (words.returncode, words.stdout) == (0, "x2\n"), words.stderr
        ended = run_orch(["ssh", "dev", "--", "echo out >&2; exit 3"], env, timeout=60)
        assert (ended.returncode, ended.stdout, ended.stderr) == (3, "", "out\n")
    finally:
        provider.terminate([i.instance_id for i in provider.list_owned()])
