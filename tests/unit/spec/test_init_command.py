"""`orch init` writes a commented starter job.yaml that orch's own spec loader accepts as it is,
never over an existing file without --force (exit 2), from templates shipped as package data."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path

import pytest

from orchestrator.spec.loading import load_job
from orchestrator.spec.starter import TEMPLATES, job_name_for, write_starter
from tests.support.in_process import isolated_home, run_main

REPO = Path(__file__).resolve().parents[3]
PACKAGE_TEMPLATES = REPO / "orchestrator" / "templates"
KEY_LINE = re.compile(r"^\s*[A-Za-z_]+:\s*\S")  # a field with its value on the line


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user's project directory holding train.py, the working directory of the test."""
    isolated_home(tmp_path, monkeypatch)
    directory = tmp_path / "Cifar Runs_2"
    directory.mkdir()
    (directory / "train.py").write_text("print('training')\n")
    monkeypatch.chdir(directory)
    return directory


def test_the_default_starter_runs_train_py_under_torchrun_and_validates(project: Path) -> None:
    code, out, err = run_main(["init"])
    assert code == 0, err
    assert "job.yaml" in out
    loaded = load_job(project / "job.yaml")
    spec = loaded.spec
    assert spec.name == "cifar-runs-2"
    assert loaded.workdir == project and spec.workdir == "."
    assert spec.run == "python train.py" and spec.launcher == "torchrun"
    assert (spec.resources.nodes, spec.resources.gpus_per_node) == (1, 1)
    assert spec.resources.spot == "auto"
    assert spec.checkpoint.dir == "~/ckpt"
    assert spec.budget.max_runtime == 4 * 3600
    assert spec.setup is None  # no requirements.txt beside it


def test_a_requirements_file_beside_it_becomes_the_setup(project: Path) -> None:
    (project / "requirements.txt").write_text("numpy\n")
    assert run_main(["init"])[0] == 0
    assert load_job(project / "job.yaml").spec.setup == "pip install -r requirements.txt"


def test_the_demo_starter_runs_the_reference_trainer(project: Path) -> None:
    code, _, err = run_main(["init", "--template", "demo", "demo.yaml"])
    assert code == 0, err
    spec = load_job(project / "demo.yaml").spec
    assert spec.run.startswith("python -m orch_trainer.train ")
    assert spec.workdir == "." and spec.budget.max_runtime == 30 * 60


def test_an_existing_file_is_kept_without_force(project: Path) -> None:
    (project / "job.yaml").write_text("mine\n")
    code, _, err = run_main(["init"])
    assert code == 2
    assert "exists already" in err and "--force" in err
    assert (project / "job.yaml").read_text() == "mine\n"
    code, out, err = run_main(["init", "--force"])
    assert code == 0, err
    assert "replaced" in out
    assert load_job(project / "job.yaml").spec.run == "python train.py"


def test_a_directory_gets_job_yaml_inside(project: Path) -> None:
    (project / "jobs").mkdir()
    assert run_main(["init", "jobs"])[0] == 0
    assert load_job(project / "jobs" / "job.yaml").spec.name == "jobs"


def test_usage_mistakes_exit_2(project: Path) -> None:
    assert run_main(["init", "--template", "nope"])[0] == 2
    code, _, err = run_main(["init", "missing/job.yaml"])
    assert code == 2 and "does not exist" in err
    assert not (project / "job.yaml").exists()


@pytest.mark.parametrize("template", TEMPLATES)
def test_every_field_is_explained(template: str, tmp_path: Path) -> None:
    text = write_starter(tmp_path / "job.yaml", template, force=False).path.read_text()
    lines = text.splitlines()
    bare = [
        line
        for number, line in enumerate(lines)
        if KEY_LINE.match(line)
        and "#" not in line
        and not lines[number - 1].lstrip().startswith("#")
    ]
    assert bare == []


@pytest.mark.parametrize(
    ("directory", "name"),
    [
        ("My Project_2", "my-project-2"),
        ("2024-runs", "runs"),
        ("___", "my-job"),
        ("x" * 80, "x" * 63),
    ],
)
def test_the_job_name_comes_from_the_directory(directory: str, name: str) -> None:
    assert job_name_for(Path("/work") / directory) == name


def test_the_templates_are_package_data() -> None:
    patterns = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]["orchestrator"]
    shipped = {p.name for p in PACKAGE_TEMPLATES.iterdir()}
    assert shipped == {f"{t}.yaml" for t in TEMPLATES}
    for name in shipped:
        assert any(fnmatch.fnmatch(f"templates/{name}", p) for p in patterns), name


def test_the_script_starter_shows_a_container_section_that_loads_uncommented(
    project: Path,
) -> None:
    text = write_starter(project / "job.yaml", "script", force=False).path.read_text()
    assert load_job(project / "job.yaml").spec.container is None  # commented out: bare nodes
    start = text.index("# container:")
    uncommented = text[:start] + re.sub(r"(?m)^# ?", "", text[start:])
    (project / "job.yaml").write_text(uncommented)
    spec = load_job(project / "job.yaml", environ={"NGC_API_KEY": "k"}).spec
    assert spec.container is not None and spec.container.ref.registry == "nvcr.io"
    assert spec.container.pull == "missing" and spec.container.credentials is not None
    assert spec.container.credentials.username == "$oauthtoken"
    assert spec.container.credentials.password_secret == "NGC_API_KEY"


def test_the_script_starter_shows_data_and_outputs_that_load_uncommented(project: Path) -> None:
    text = write_starter(project / "job.yaml", "script", force=False).path.read_text()
    spec = load_job(project / "job.yaml").spec
    assert spec.data == [] and spec.outputs == []  # commented out
    uncommented = text
    for section in ("# data:", "# outputs:"):
        start = uncommented.index(section)
        end = uncommented.index("\n\n", start)
        block = re.sub(r"(?m)^# ?", "", uncommented[start:end])
        uncommented = uncommented[:start] + block + uncommented[end:]
    (project / "job.yaml").write_text(uncommented)
    (project / "data").mkdir()
    loaded = load_job(project / "job.yaml")
    assert [m.bucket_url for m in loaded.spec.data] == [None, "s3://my-bucket/datasets/imagenet"]
    assert loaded.data_sources == [(project / "data").resolve(), None]
    (output,) = loaded.spec.outputs
    assert output.dst == f"s3://my-bucket/results/{job_name_for(project)}"
    assert output.src == "~/out" and output.nodes == "head"
