"""infra/ against moto: terraform init, apply, check, plan, destroy, offline (`make infra-test`).

The flow lives in scripts/infra_test.sh (one source of truth for `make infra-test` and `make test`);
this test runs it and fails, never skips, when terraform or the provider mirror is missing.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "infra_test.sh"
TIMEOUT_S = 240  # about 60 s here; generous for a loaded machine


def _terraform() -> str:
    found = os.environ.get("TERRAFORM") or shutil.which("terraform")
    if not found:
        for candidate in ("/usr/local/bin/terraform", "/usr/bin/terraform"):
            if os.access(candidate, os.X_OK):
                found = candidate
                break
    if not found:
        pytest.fail(
            "terraform is not installed (not on PATH, not /usr/local/bin/terraform): the infra/ "
            "test needs Terraform >= 1.5 and the hashicorp/aws provider mirror; set TERRAFORM "
            "to the binary",
            pytrace=False,
        )
    return found


def _tail(text: str, lines: int = 60) -> str:
    return "\n".join(text.splitlines()[-lines:])


def test_infra_apply_and_destroy_against_moto() -> None:
    env = dict(os.environ)
    env["TERRAFORM"] = _terraform()
    env["ORCH_PYTHON"] = sys.executable
    env.pop("ORCH_INFRA_KEEP", None)
    started = time.monotonic()
    proc = subprocess.Popen(
        ["bash", str(SCRIPT)],
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # so a timeout can end terraform, the provider and moto together
    )
    try:
        output, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            output, _ = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
        pytest.fail(
            f"scripts/infra_test.sh ran over {TIMEOUT_S} s:\n{_tail(output)}", pytrace=False
        )
    elapsed = time.monotonic() - started
    report = "\n".join(line for line in output.splitlines() if not line.startswith("127.0.0.1 - -"))
    if proc.returncode != 0:
        pytest.fail(
            f"infra_test.sh exited {proc.returncode} after {elapsed:.0f} s:\n{_tail(report)}",
            pytrace=False,
        )
    assert "infra-test: PASS" in output, _tail(report)
    for step in (
        "init ok",
        "apply ok",
        "resources checked",
        "plan after apply: no changes",
        "destroy ok",
    ):
        assert f"infra-test: {step}" in output, f"step {step!r} missing:\n{_tail(report)}"
    # the controller host's role was applied and its policy's tag conditions checked
    assert "controller role" in output, _tail(report)
