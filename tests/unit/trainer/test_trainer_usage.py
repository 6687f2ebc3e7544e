"""The trainer refuses bad flags and missing inputs with one `trainer: error:` line on stderr
and exit 2, before any step: each case through `orch_trainer.train.main` in this process
(tests/e2e/test_trainer.py shows one of them in a real process)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from orch_trainer.signals import STOP_SIGNALS
from orch_trainer.train import main

TINY = ["--model", "tiny", "--workers", "0", "--checkpoint-seconds", "0", "--log-every", "1"]


@pytest.fixture
def signal_handlers_kept() -> Iterator[None]:
    """main() installs its stop handlers: give the test process its own back afterwards."""
    saved = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--batch-size", "0"], "--batch-size"),
        (["--no-such-flag"], "unrecognized arguments"),
        (["--data", "/nonexistent/images"], "/nonexistent/images"),
        (["--data", "cifar10:/nonexistent/cifar"], "cifar10 data not found"),
        (["--resume", "/nonexistent/step-000001"], "does not exist"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    args: list[str],
    fragment: str,
    capsys: pytest.CaptureFixture[str],
    signal_handlers_kept: None,
) -> None:
    drop = ("ORCH_", "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_", "TORCHELASTIC_", "GROUP_")
    environ = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    code = main([*TINY, "--fake-size", "8", "--steps", "1", *args], environ)
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert err.count("\n") == 1, err
    assert err.startswith("trainer: error: ") and fragment in err, err
    assert "Traceback" not in err
    assert not [line for line in out.splitlines() if line.startswith("{")], out
