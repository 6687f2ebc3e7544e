"""The spec's `secrets` and the references in `env`: what is taken from the submitting shell,
what is refused and how the message says to fix it, and what the public document shows."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.errors import SpecError
from orchestrator.spec.loading import assignment_overrides, load_job
from orchestrator.spec.model import SECRET_HIDDEN
from tests.unit.spec_cases import MINIMAL, write

SHELL = {"WANDB_API_KEY": "wb-123", "USER": "ada", "ODD": "x$HOME${USER}$$"}


def _spec_error(path: Path, environ: dict[str, str], overrides: dict | None = None) -> str:
    with pytest.raises(SpecError) as info:
        load_job(path, overrides, environ=environ)
    assert info.value.exit_code == 2
    return f"{info.value}\n{info.value.hint or ''}"


def test_env_references_are_expanded_from_the_submitting_shell(tmp_path: Path) -> None:
    text = MINIMAL + (
        "env:\n"
        "  KEY: ${WANDB_API_KEY}\n"
        "  RUN: $USER-run-${USER}\n"
        "  PRICE: 5$$ and $$USER\n"
        "  KEPT: $1 $ (a$-b) $(id)\n"
        "  TWICE: ${ODD}\n"
        "  PLAIN: WARN\n"
    )
    spec = load_job(write(tmp_path, text), environ=SHELL).spec
    assert spec.env == {
        "KEY": "wb-123",
        "RUN": "ada-run-ada",
        "PRICE": "5$ and $USER",
        "KEPT": "$1 $ (a$-b) $(id)",
        "TWICE": "x$HOME${USER}$$",  # a value put in is not expanded again
        "PLAIN": "WARN",
    }


@pytest.mark.parametrize("value", ["${WANDB_KEY}", "$WANDB_KEY", "prefix-${WANDB_KEY}-suffix"])
def test_an_unset_reference_in_env_is_refused_with_a_hint(tmp_path: Path, value: str) -> None:
    path = write(tmp_path, MINIMAL + f"env:\n  NCCL_DEBUG: WARN\n  TOKEN: {value}\n")
    message = _spec_error(path, SHELL)
    assert "env.TOKEN (line 6)" in message, message
    assert "${WANDB_KEY} is not set in the submitting shell" in message, message
    assert "export it" in message and "secrets:" in message, message


@pytest.mark.parametrize("value", ["${A:-x}", "${}", "${A", "${1}"])
def test_a_shell_expression_is_not_taken_for_a_reference(tmp_path: Path, value: str) -> None:
    message = _spec_error(write(tmp_path, MINIMAL + f"env: {{X: '{value}'}}\n"), {"A": "a"})
    assert "env.X (line 4)" in message and "not a variable reference" in message, message
    assert "$$ for a literal $" in message, message


def test_an_env_value_left_empty_points_to_secrets(tmp_path: Path) -> None:
    message = _spec_error(write(tmp_path, MINIMAL + "env:\n  HF_TOKEN: null\n"), SHELL)
    assert "env.HF_TOKEN (line 5): has no value" in message, message
    assert "secrets:" in message, message


def test_a_secret_without_a_value_is_taken_from_the_shell(tmp_path: Path) -> None:
    text = MINIMAL + "secrets:\n  WANDB_API_KEY:\n  OTHER: ${USER}-$$\n  COUNT: 7\n"
    spec = load_job(write(tmp_path, text), environ=SHELL).spec
    assert spec.secrets == {"WANDB_API_KEY": "wb-123", "OTHER": "ada-$", "COUNT": "7"}
    document = spec.public_document()
    assert document["secrets"] == dict.fromkeys(spec.secrets, SECRET_HIDDEN)
    assert "wb-123" not in str(document) and "ada-$" not in str(document)


def test_a_missing_secret_names_the_variable_and_how_to_give_it(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "secrets:\n  HF_TOKEN: null\n")
    message = _spec_error(path, SHELL)
    assert "secrets.HF_TOKEN (line 5)" in message, message
    assert "HF_TOKEN is not set in the submitting shell" in message, message
    assert "export HF_TOKEN=" in message and "--secret HF_TOKEN=VALUE" in message, message


def test_a_secret_value_is_never_echoed_in_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "secrets: {TOKEN: 2025-01-02T03:04:05Z}\n")
    message = _spec_error(path, SHELL)
    assert "secrets.TOKEN (line 4)" in message and "not shown" in message, message
    assert "2025" not in message and "03:04" not in message, message


def test_env_values_show_in_the_public_document(tmp_path: Path) -> None:
    spec = load_job(write(tmp_path, MINIMAL + "env: {OMP_NUM_THREADS: 1}\n"), environ={}).spec
    assert spec.public_document()["env"] == {"OMP_NUM_THREADS": "1"}
    assert spec.public_document()["secrets"] == {}


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("env: {A: 1}\nsecrets: {A: 2}\n", "A is in both env and secrets"),
        ("secrets: {ORCH_X: 1}\n", "reserved"),
        ("secrets: {1X: 1}\n", "invalid variable name"),
        ("secrets: [A]\n", "must be a mapping"),
    ],
)
def test_bad_secrets_are_refused(tmp_path: Path, text: str, words: str) -> None:
    message = _spec_error(write(tmp_path, MINIMAL + text), SHELL)
    assert words in message, message


def test_a_spec_with_secrets_is_not_read_as_a_skypilot_task(tmp_path: Path) -> None:
    spec = load_job(write(tmp_path, MINIMAL + "secrets: {WANDB_API_KEY: null}\n"), environ=SHELL)
    assert spec.spec.launcher == "torchrun" and spec.spec.secrets == {"WANDB_API_KEY": "wb-123"}


def test_a_skypilot_task_s_secrets_are_orch_s(tmp_path: Path) -> None:
    text = "num_nodes: 1\nrun: python main.py\nsecrets:\n  WANDB_API_KEY: null\n"
    spec = load_job(write(tmp_path, text), environ=SHELL).spec
    assert spec.launcher == "none" and spec.secrets == {"WANDB_API_KEY": "wb-123"}
    message = _spec_error(write(tmp_path, text), {})
    assert "secrets.WANDB_API_KEY (line 4)" in message and "--secret" in message, message


# --- --env and --secret ----------------------------------------------------------------------


def test_flags_set_env_and_secrets_taking_bare_names_from_the_shell(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "env: {LEVEL: 1}\nsecrets: {WANDB_API_KEY: from-file}\n")
    overrides = {
        **assignment_overrides("--env", "env", ["LEVEL=2", "USER", "RAW=$HOME=x"], SHELL),
        **assignment_overrides("--secret", "secrets", ["WANDB_API_KEY", "ODD"], SHELL),
    }
    spec = load_job(path, overrides, environ=SHELL).spec
    assert spec.env == {"LEVEL": "2", "USER": "ada", "RAW": "$HOME=x"}  # flags: taken as given
    assert spec.secrets == {"WANDB_API_KEY": "wb-123", "ODD": "x$HOME${USER}$$"}


def test_a_flag_naming_an_unset_variable_exits_2_naming_it() -> None:
    with pytest.raises(SpecError) as info:
        assignment_overrides("--secret", "secrets", ["HF_TOKEN"], SHELL)
    assert info.value.exit_code == 2
    assert "--secret HF_TOKEN: HF_TOKEN is not set in this shell" in str(info.value)
    assert "--secret HF_TOKEN=VALUE" in (info.value.hint or "")


@pytest.mark.parametrize("item", ["", "=x", "1A=x", "A.B=x", "A B"])
def test_a_flag_with_a_bad_name_exits_2(item: str) -> None:
    with pytest.raises(SpecError, match="is not a variable name") as info:
        assignment_overrides("--env", "env", [item], SHELL)
    assert info.value.exit_code == 2


def test_a_flag_s_bad_value_is_reported_as_that_flag(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "secrets: {A: 1}\n")
    message = _spec_error(path, SHELL, assignment_overrides("--env", "env", ["A=2"], SHELL))
    assert "A is in both env and secrets" in message, message
    message = _spec_error(
        write(tmp_path, MINIMAL), SHELL, assignment_overrides("--env", "env", ["ORCH_A=2"], SHELL)
    )
    assert "--env ORCH_A" in message and "(from the command line)" in message, message
