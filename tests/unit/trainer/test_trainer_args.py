"""Flag parsing: defaults from the environment, one-line errors with exit status 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from orch_trainer.args import parse_args, parse_data_spec
from orch_trainer.errors import UsageError
from orch_trainer.train import main


def test_defaults() -> None:
    cfg = parse_args([], {})
    assert cfg.model == "resnet18"
    assert str(cfg.data) == "fake"
    assert cfg.checkpoint_dir is None
    assert (cfg.resume, cfg.keep, cfg.timeout, cfg.amp) == ("auto", 3, 60.0, "auto")
    assert cfg.steps is None and cfg.epochs is None


def test_checkpoint_dir_comes_from_the_environment_unless_given(tmp_path: Path) -> None:
    env = {"ORCH_CHECKPOINT_DIR": str(tmp_path / "env")}
    assert parse_args([], env).checkpoint_dir == tmp_path / "env"
    flag = parse_args(["--checkpoint-dir", str(tmp_path / "flag")], env)
    assert flag.checkpoint_dir == tmp_path / "flag"
    assert parse_args([], {"ORCH_CHECKPOINT_DIR": ""}).checkpoint_dir is None
    assert parse_args(["--checkpoint-dir", ""], env).checkpoint_dir is None


def test_data_forms(tmp_path: Path) -> None:
    assert parse_data_spec("fake").kind == "fake"
    cifar = parse_data_spec(f"cifar10:{tmp_path}")
    assert (cifar.kind, cifar.path) == ("cifar10", tmp_path)
    folder = parse_data_spec(str(tmp_path))
    assert (folder.kind, folder.path) == ("folder", tmp_path)
    with pytest.raises(UsageError):
        parse_data_spec("cifar10:")


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--batch-size", "0"], "--batch-size: must be at least 1"),
        (["--lr", "0"], "--lr: must be greater than 0"),
        (["--model", "vgg"], "invalid choice"),
        (["--amp", "fp8"], "invalid choice"),
        (["--bogus"], "unrecognized arguments: --bogus"),
        (["--steps"], "expected one argument"),
        (["--data", "cifar10:"], "cifar10 needs a folder"),
        (["--seed", "-1"], "--seed: must be at least 0"),
        (["--timeout", "nan"], "--timeout"),
    ],
)
def test_bad_flags_exit_2_with_one_line(
    argv: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv, {}) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("trainer: error: ")
    assert fragment in err
