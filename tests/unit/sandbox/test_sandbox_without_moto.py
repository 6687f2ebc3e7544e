"""`orch sandbox aws` where moto is not installed (no `dev` extra): a clear error saying how to
install it, before the sandbox makes or removes anything; the rest of orch never imports moto."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

# Runs `argv` with moto (and what its server needs) impossible to import, as if not installed.
WITHOUT_MOTO = """
import sys

class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("moto", "werkzeug", "flask"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
sys.argv = ["orch", *sys.argv[1:]]
from orchestrator.cli import main
main()
"""


def orch_without_moto(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ORCH_HOME": str(home), "PYTHONPATH": str(ROOT), "NO_COLOR": "1"}
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_MOTO, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_the_sandbox_says_how_to_install_moto_and_touches_nothing(tmp_path: Path) -> None:
    result = orch_without_moto(tmp_path, "sandbox", "aws", "--port", "0")
    output = result.stdout + result.stderr
    assert result.returncode == 3, output  # a ProviderError
    assert "moto" in output and "pip install 'orch[dev]'" in output, output
    assert "Traceback" not in output, output
    assert not (tmp_path / "sandbox").exists(), "the sandbox started before it knew"


def test_the_rest_of_orch_runs_without_moto(tmp_path: Path) -> None:
    result = orch_without_moto(tmp_path, "sandbox", "--help")
    assert result.returncode == 0, result.stderr
    result = orch_without_moto(tmp_path, "status")
    assert result.returncode == 0, result.stderr
