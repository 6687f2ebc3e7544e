"""Reading `run` and `setup` as a user would: which scripts and modules they run, and which of
those the workdir (as synced) does not hold, with the names it does hold that come closest."""

from __future__ import annotations

import pytest

from orchestrator.spec.script_check import ScriptWarning, check_commands, targets

TUTORIAL = ["multinode.py", "datautils.py"]  # PyTorch's multi-node DDP tutorial's workdir


def shown(command: str) -> list[tuple[str, str, str]]:
    return [(t.kind, t.written, t.path) for t in targets(command)]


@pytest.mark.parametrize(
    ("command", "found"),
    [
        ("python train.py", [("script", "train.py", "train.py")]),
        ("python3 -u ./train.py --epochs 5", [("script", "./train.py", "train.py")]),
        ("/opt/venv/bin/python3.11 -X dev -W ignore src/train.py", [
            ("script", "src/train.py", "src/train.py")]),
        ("OMP_NUM_THREADS=1 exec python -O train.py", [("script", "train.py", "train.py")]),
        ("env A=1 B=2 python train.py", [("script", "train.py", "train.py")]),
        ("uv run python train.py", [("script", "train.py", "train.py")]),
        ("cd src && python train.py", [("script", "train.py", "src/train.py")]),
        ("cd src; cd ..; python train.py", [("script", "train.py", "train.py")]),
        ("torchrun --nproc_per_node 2 --standalone train.py --lr 0.1", [
            ("script", "train.py", "train.py")]),
        ("accelerate launch --num_processes 2 train.py", [("script", "train.py", "train.py")]),
        ("python -m torch.distributed.run --nproc_per_node=2 train.py", [
            ("module", "torch.distributed.run", "torch.distributed.run"),
            ("script", "train.py", "train.py")]),
        ("python -m trainer.main --x 1", [("module", "trainer.main", "trainer.main")]),
        ("python -um trainer", [("module", "trainer", "trainer")]),
        ("echo start; python a.py && python b.py | tee log\npython c.py > out.txt 2>&1", [
            ("script", "a.py", "a.py"), ("script", "b.py", "b.py"), ("script", "c.py", "c.py")]),
        ("python train.py \\\n  --epochs 5", [("script", "train.py", "train.py")]),
    ],
)  # fmt: skip
def test_the_scripts_and_modules_a_command_runs(command: str, found: list) -> None:
    assert shown(command) == found


@pytest.mark.parametrize(
    "command",
    [
        "python -c 'import train'",
        "python",
        "python - < train.py",
        "python $SCRIPT",
        "python ~/train.py",
        "python /opt/app/train.py",
        "python ../train.py",
        "python train_*.py",
        "python run.sh",
        "bash run.sh",
        "cd /opt/app && python train.py",
        "cd $DIR && python train.py",
        "cd .. && python train.py",
        "python 'unclosed",
        "torchrun -m pkg.train",
        "python --version",
    ],
)
def test_what_cannot_be_read_is_not_looked_at(command: str) -> None:
    assert targets(command) == []


def test_the_tutorial_s_misnamed_script_is_named_with_the_one_it_holds() -> None:
    (warning,) = check_commands({"run": "python train.py --epochs 5"}, TUTORIAL[:1])
    assert warning == ScriptWarning("run", "script", "train.py", "train.py", ("multinode.py",))
    assert warning.message() == (
        "run: python train.py: train.py is not in the workdir; did you mean multinode.py?"
    )


def test_a_typo_gets_the_closest_names() -> None:
    (warning,) = check_commands({"run": "torchrun --nproc_per_node 2 multinod.py"}, TUTORIAL)
    assert warning.suggestions == ("multinode.py",)
    (warning,) = check_commands({"run": "cd src && python trian.py"}, ["src/train.py", "x.py"])
    assert warning.path == "src/trian.py" and warning.suggestions == ("train.py",)


def test_found_scripts_and_modules_are_not_questioned() -> None:
    synced = ["train.py", "src/train.py", "pkg/__init__.py", "pkg/main.py", "app/__main__.py"]
    commands = {
        "setup": "python src/train.py --prepare",
        "run": "python train.py; python -m pkg.main; python -m app; cd src && python train.py",
    }
    assert check_commands(commands, synced) == []


def test_a_script_left_out_by_the_ignore_files_is_told_so() -> None:
    (warning,) = check_commands({"run": "python train.py"}, ["other.py"], on_disk={"train.py"})
    assert warning.ignored
    assert "left out of the sync by .gitignore or .orchignore" in warning.message()


def test_setup_is_read_too_and_a_script_setup_names_is_left_to_it() -> None:
    (warning,) = check_commands(
        {"setup": "python prepare_data.py", "run": "python train.py"}, ["prepare.py", "train.py"]
    )
    assert (warning.field, warning.suggestions) == ("setup", ("prepare.py",))
    made = {"setup": "curl -o train.py https://example.invalid/t", "run": "python train.py"}
    assert check_commands(made, []) == []


def test_modules_of_the_workdir() -> None:
    synced = ["trainer/__init__.py", "trainer/main.py", "tools/x.py"]
    (missing,) = check_commands({"run": "python -m trainer.mian"}, synced)
    assert missing.message() == (
        "run: python -m trainer.mian: no module trainer.mian in the workdir; "
        "did you mean trainer.main?"
    )
    (package,) = check_commands({"run": "python -m trainer"}, synced)
    assert package.message() == (
        "run: python -m trainer: trainer is a package without __main__.py, which -m needs"
    )
    # A module outside the workdir is questioned only when it is nobody's but a typo's.
    (typo,) = check_commands({"run": "python -m trainr.main"}, synced)
    assert typo.suggestions == ("trainer.main",)
    assert check_commands({"run": "python -m trainr.main"}, synced, installed={"trainr"}) == []
    assert check_commands({"run": "python -m torch.distributed.run x.py"}, ["x.py"]) == []
    assert check_commands({"run": "python -m trainr.main"}, synced, env={"PYTHONPATH"}) == []
    assert check_commands({"run": "PYTHONPATH=src python -m trainr.main"}, synced) == []
    installs = {"setup": "pip install -e .", "run": "python -m trainr.main"}
    assert check_commands(installs, synced) == []


def test_without_a_close_name_a_few_scripts_beside_it_are_offered() -> None:
    (warning,) = check_commands({"run": "python go.py"}, ["alpha.py", "beta.py", "sub/zeta.py"])
    assert warning.suggestions == ("alpha.py", "beta.py")
    many = [f"s{i}.py" for i in range(10)]
    (warning,) = check_commands({"run": "python go.py"}, many)
    assert warning.suggestions == ()
    assert warning.message() == "run: python go.py: go.py is not in the workdir"


def test_the_json_form_carries_the_message() -> None:
    (warning,) = check_commands({"run": "python train.py"}, TUTORIAL[:1])
    assert warning.as_dict() == {
        "field": "run",
        "kind": "script",
        "written": "train.py",
        "path": "train.py",
        "suggestions": ["multinode.py"],
        "ignored": False,
        "message": warning.message(),
    }
