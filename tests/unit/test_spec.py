"""Tests of the job spec: models, YAML loading, overrides and the errors a user sees."""

from __future__ import annotations

import json
import re
import tempfile
from decimal import Decimal
from pathlib import Path, PurePosixPath

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.errors import SpecError
from orchestrator.spec import (
    MAX_SPEC_BYTES,
    OVERRIDE_FLAGS,
    CheckpointSpec,
    DataMount,
    JobSpec,
    LoadedJob,
    parse_duration,
)
from orchestrator.spec_loading import load_job

# The example of DESIGN.md ("Job spec"), verbatim.
FULL_EXAMPLE = """\
name: cifar-ddp
workdir: .                      # synced to every node, honours .gitignore and .orchignore
data: [{src: ./data, dst: ~/data}]
setup: pip install -r requirements.txt
run: python -m trainer.train --epochs 5     # run under torchrun on every node
resources: {gpus_per_node: 4, accelerator: A10G, nodes: 2, spot: true, max_price_per_hour: 3.0}
checkpoint: {dir: ~/ckpt, pull_every: 60}
budget: {max_cost_usd: 20, idle_timeout: 600, max_runtime: 4h}
recovery: {max_recoveries: 5}
env: {NCCL_DEBUG: WARN}
"""

MINIMAL = """\
name: tiny
workdir: .
run: python train.py
"""

# Block style, so that each field sits on its own line (line numbers are asserted below).
BLOCK = """\
name: block-job
workdir: .
data:
  - src: ./data
    dst: ~/data
run: python train.py
resources:
  nodes: 2
  gpus_per_node: 2
budget:
  max_cost_usd: 5
  max_runtime: 1h30m
env:
  NCCL_DEBUG: WARN
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project directory holding a `data/` directory next to where job.yaml is written."""
    (tmp_path / "data").mkdir()
    return tmp_path


def write(directory: Path, text: str, name: str = "job.yaml") -> Path:
    path = directory / name
    path.write_text(text)
    return path


def spec_error(path: Path, overrides: dict[str, object] | None = None) -> str:
    """Load `path`, expect a SpecError, return its message (and check it is clean)."""
    with pytest.raises(SpecError) as info:
        load_job(path, overrides)
    assert info.value.exit_code == 2
    message = str(info.value)
    assert "Traceback" not in message
    assert "errors.pydantic.dev" not in message
    assert "validation error" not in message
    return message


def replace_line(text: str, old: str, new: str) -> str:
    assert old in text
    return text.replace(old, new)


# --------------------------------------------------------------------------------------------
# Valid specs


def test_full_example_loads(project: Path) -> None:
    job = load_job(write(project, FULL_EXAMPLE))

    assert isinstance(job, LoadedJob)
    assert job.source == project / "job.yaml"
    assert job.base_dir == project
    assert job.workdir == project.resolve()
    assert job.data_sources == [(project / "data").resolve()]
    spec = job.spec
    assert spec.name == "cifar-ddp"
    assert spec.workdir == "."
    assert spec.data == [DataMount(src="./data", dst="~/data")]
    assert spec.setup == "pip install -r requirements.txt"
    assert spec.run == "python -m trainer.train --epochs 5"
    assert spec.resources.nodes == 2
    assert spec.resources.gpus_per_node == 4
    assert spec.resources.total_gpus == 8
    assert spec.resources.accelerator == "A10G"
    assert spec.resources.spot is True
    assert spec.resources.max_price_per_hour == Decimal("3.0")
    assert spec.checkpoint.dir == "~/ckpt"
    assert spec.checkpoint.pull_every == 60.0
    assert spec.budget.max_cost_usd == Decimal("20")
    assert spec.budget.idle_timeout == 600.0
    assert spec.budget.max_runtime == 4 * 3600.0
    assert spec.recovery.max_recoveries == 5
    assert spec.env == {"NCCL_DEBUG": "WARN"}
    assert spec.provider == "local"


def test_model_dump_json_round_trips(project: Path) -> None:
    spec = load_job(write(project, FULL_EXAMPLE)).spec
    dumped = spec.model_dump(mode="json")
    text = json.dumps(dumped)
    assert JobSpec.model_validate(json.loads(text)) == spec
    assert dumped["budget"]["max_cost_usd"] == "20"


def test_defaults(project: Path) -> None:
    job = load_job(write(project, MINIMAL))
    spec = job.spec
    assert spec.data == []
    assert spec.setup is None
    assert spec.resources.nodes == 1
    assert spec.resources.gpus_per_node == 1
    assert spec.resources.accelerator is None
    assert spec.resources.spot is False
    assert spec.resources.max_price_per_hour is None
    assert spec.resources.min_gpu_memory_gb is None
    assert spec.checkpoint.dir is None
    assert spec.checkpoint.pull_every == 60.0
    assert spec.budget.max_cost_usd is None
    assert spec.budget.max_hourly_usd is None
    assert spec.budget.idle_timeout is None
    assert spec.budget.max_runtime is None
    assert spec.recovery.max_recoveries == 3
    assert spec.env == {}
    assert spec.provider == "local"
    assert job.data_sources == []


def test_empty_sections_mean_defaults(project: Path) -> None:
    text = MINIMAL + "resources:\nbudget:\nenv:\ndata:\ncheckpoint:\nrecovery:\n"
    spec = load_job(write(project, text)).spec
    assert spec.resources.nodes == 1
    assert spec.env == {}
    assert spec.data == []


def test_spot_auto_and_env_values_become_strings(project: Path) -> None:
    text = MINIMAL + (
        "resources: {spot: auto}\n"
        "env: {WORKERS: 8, RATE: 0.5, DEBUG: true, QUIET: false, NAME: x}\n"
    )
    spec = load_job(write(project, text)).spec
    assert spec.resources.spot == "auto"
    assert spec.env == {
        "WORKERS": "8",
        "RATE": "0.5",
        "DEBUG": "true",
        "QUIET": "false",
        "NAME": "x",
    }


def test_relative_workdir_resolves_against_the_spec_directory(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (project / "code").mkdir()
    spec_dir = project / "specs"
    spec_dir.mkdir()
    path = write(spec_dir, "name: a\nworkdir: ../code\nrun: x\ndata: [{src: ../data, dst: d}]\n")
    monkeypatch.chdir("/")
    job = load_job(path)
    assert job.workdir == (project / "code").resolve()
    assert job.data_sources == [(project / "data").resolve()]


def test_home_in_workdir_is_expanded(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(project))
    job = load_job(write(project, "name: a\nworkdir: ~/data\nrun: x\n"))
    assert job.workdir == (project / "data").resolve()


def test_overrides_win(project: Path) -> None:
    overrides: dict[str, object] = {
        "resources.nodes": 2,
        "resources.gpus_per_node": 2,
        "resources.spot": True,
        "budget.max_cost_usd": "5",
        "budget.idle_timeout": 60,
        "provider": "aws",
        "resources.accelerator": None,  # None: left as the file says
    }
    text = MINIMAL + "resources: {nodes: 4, accelerator: A10G}\nbudget: {max_cost_usd: 50}\n"
    spec = load_job(write(project, text), overrides).spec
    assert spec.resources.nodes == 2
    assert spec.resources.gpus_per_node == 2
    assert spec.resources.spot is True
    assert spec.resources.accelerator == "A10G"
    assert spec.budget.max_cost_usd == Decimal("5")
    assert spec.budget.idle_timeout == 60.0
    assert spec.provider == "aws"


def test_override_into_a_section_the_file_lacks(project: Path) -> None:
    spec = load_job(write(project, MINIMAL), {"budget.max_runtime": "2h"}).spec
    assert spec.budget.max_runtime == 7200.0


def test_override_flags_cover_the_cli() -> None:
    assert OVERRIDE_FLAGS["resources.nodes"] == "--nodes"
    assert OVERRIDE_FLAGS["resources.gpus_per_node"] == "--gpus"
    assert OVERRIDE_FLAGS["resources.spot"] == "--spot"
    assert OVERRIDE_FLAGS["budget.max_cost_usd"] == "--max-cost"
    assert OVERRIDE_FLAGS["budget.idle_timeout"] == "--idle-timeout"
    assert OVERRIDE_FLAGS["provider"] == "--provider"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        (600, 600.0),
        (1.5, 1.5),
        ("600", 600.0),
        ("90s", 90.0),
        ("30m", 1800.0),
        ("4h", 14400.0),
        ("1h30m", 5400.0),
        ("1h 30m 15s", 5415.0),
        ("2d", 172800.0),
        ("1.5h", 5400.0),
        ("4H", 14400.0),
    ],
)
def test_parse_duration(text: str | float, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "4 hours", "h", "1h1h", "5x", "-3m", "1.h"])
def test_parse_duration_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize("value", [True, None, [1], {"a": 1}])
def test_parse_duration_refuses_non_durations(value: object) -> None:
    with pytest.raises(ValueError):
        parse_duration(value)


def test_node_paths() -> None:
    home = PurePosixPath("/home/orch")
    workdir = PurePosixPath("/home/orch/work")
    assert DataMount(src="d", dst="~/data").node_path(home) == home / "data"
    assert DataMount(src="d", dst="~").node_path(home) == home
    assert DataMount(src="d", dst="data/x").node_path(home) == home / "data/x"
    assert DataMount(src="d", dst="/mnt/data").node_path(home) == PurePosixPath("/mnt/data")
    assert CheckpointSpec().node_dir(home, workdir) is None
    assert CheckpointSpec(dir="ckpt").node_dir(home, workdir) == workdir / "ckpt"
    assert CheckpointSpec(dir="~/ckpt").node_dir(home, workdir) == home / "ckpt"
    assert CheckpointSpec(dir="/ckpt").node_dir(home, workdir) == PurePosixPath("/ckpt")


# --------------------------------------------------------------------------------------------
# Bad specs: each names the field and its line


def test_yaml_syntax_error_names_file_and_line(project: Path) -> None:
    path = write(project, "name: x\nworkdir: .\nrun: [python\nresources: {nodes: 1}\n")
    message = spec_error(path)
    assert "job.yaml" in message
    assert re.search(r"line [34]\b", message), message


def test_bad_indentation_names_the_line(project: Path) -> None:
    path = write(
        project, "name: x\nworkdir: .\nrun: y\nresources:\n  nodes: 1\n   gpus_per_node: 2\n"
    )
    message = spec_error(path)
    assert "job.yaml" in message
    assert "line 6" in message


def test_unknown_field_with_suggestion(project: Path) -> None:
    text = BLOCK.replace("  gpus_per_node: 2\n", "  gpu: 2\n")
    message = spec_error(write(project, text))
    assert "unknown field `resources.gpu` (line 9)" in message
    assert "did you mean `gpus_per_node`?" in message


def test_unknown_field_without_close_name_lists_the_known_ones(project: Path) -> None:
    message = spec_error(write(project, MINIMAL + "colour: blue\n"))
    assert "unknown field `colour` (line 4)" in message
    assert "name, workdir" in message


def test_misspelled_top_level_field(project: Path) -> None:
    message = spec_error(write(project, MINIMAL + "resource: {nodes: 2}\n"))
    assert "unknown field `resource` (line 4)" in message
    assert "did you mean `resources`?" in message


def test_nodes_zero(project: Path) -> None:
    message = spec_error(write(project, BLOCK.replace("  nodes: 2\n", "  nodes: 0\n")))
    assert "resources.nodes (line 8)" in message
    assert ">= 1" in message


def test_nodes_too_many(project: Path) -> None:
    message = spec_error(write(project, BLOCK.replace("  nodes: 2\n", "  nodes: 65\n")))
    assert "resources.nodes (line 8)" in message
    assert "<= 64" in message


def test_negative_gpus(project: Path) -> None:
    text = BLOCK.replace("  gpus_per_node: 2\n", "  gpus_per_node: -1\n")
    message = spec_error(write(project, text))
    assert "resources.gpus_per_node (line 9)" in message
    assert ">= 1" in message


def test_boolean_is_not_a_count(project: Path) -> None:
    message = spec_error(write(project, BLOCK.replace("  nodes: 2\n", "  nodes: true\n")))
    assert "resources.nodes (line 8)" in message


def test_flow_style_error_points_at_the_section_line(project: Path) -> None:
    message = spec_error(write(project, MINIMAL + "resources: {nodes: 2, gpus_per_node: 0}\n"))
    assert "resources.gpus_per_node (line 4)" in message


def test_missing_workdir_field(project: Path) -> None:
    message = spec_error(write(project, "name: x\nrun: python train.py\n"))
    assert "workdir (line 1): required field is missing" in message


def test_missing_field_in_a_list_item_points_at_the_item(project: Path) -> None:
    message = spec_error(write(project, BLOCK.replace("    dst: ~/data\n", "")))
    assert "data[0].dst (line 4): required field is missing" in message


def test_workdir_that_does_not_exist(project: Path) -> None:
    message = spec_error(write(project, MINIMAL.replace("workdir: .", "workdir: ./nope")))
    assert "workdir (line 2)" in message
    assert str(project.resolve() / "nope") in message
    assert "does not exist" in message


def test_workdir_that_is_a_file(project: Path) -> None:
    (project / "file.txt").write_text("x")
    message = spec_error(write(project, MINIMAL.replace("workdir: .", "workdir: file.txt")))
    assert "workdir (line 2)" in message
    assert "is not a directory" in message


def test_data_source_that_does_not_exist(project: Path) -> None:
    message = spec_error(write(project, BLOCK.replace("src: ./data", "src: ./missing")))
    assert "data[0].src (line 4)" in message
    assert str(project.resolve() / "missing") in message


@pytest.mark.parametrize("run", ['""', '"   "'])
def test_empty_run(project: Path, run: str) -> None:
    message = spec_error(write(project, MINIMAL.replace("run: python train.py", f"run: {run}")))
    assert "run (line 3)" in message
    assert "must not be empty" in message


def test_missing_run(project: Path) -> None:
    message = spec_error(write(project, "name: x\nworkdir: .\n"))
    assert "run (line 1): required field is missing" in message


def test_bad_duration(project: Path) -> None:
    message = spec_error(
        write(project, BLOCK.replace("max_runtime: 1h30m", "max_runtime: 4 hours"))
    )
    assert "budget.max_runtime (line 12)" in message
    assert "'4 hours'" in message
    assert "1h30m" in message  # says what is accepted


def test_zero_duration(project: Path) -> None:
    message = spec_error(write(project, MINIMAL + "budget: {idle_timeout: 0s}\n"))
    assert "budget.idle_timeout (line 4)" in message
    assert "> 0" in message


@pytest.mark.parametrize(
    ("name", "reason"),
    [("1BAD", "not starting with a digit"), ("BAD-NAME", "letters, digits and '_'")],
)
def test_bad_env_name(project: Path, name: str, reason: str) -> None:
    message = spec_error(write(project, BLOCK.replace("NCCL_DEBUG: WARN", f"{name}: x")))
    assert f"env.{name} (line 14)" in message
    assert reason in message


def test_reserved_env_name(project: Path) -> None:
    message = spec_error(write(project, BLOCK.replace("NCCL_DEBUG: WARN", "ORCH_JOB_ID: x")))
    assert "env.ORCH_JOB_ID (line 14)" in message
    assert "reserved" in message


def test_env_value_must_be_scalar(project: Path) -> None:
    message = spec_error(write(project, BLOCK.replace("NCCL_DEBUG: WARN", "NCCL_DEBUG: [1]")))
    assert "env.NCCL_DEBUG (line 14)" in message


@pytest.mark.parametrize("name", ["Cifar", "1job", "job_name", "-job", "a" * 64, '""'])
def test_bad_name(project: Path, name: str) -> None:
    message = spec_error(write(project, MINIMAL.replace("name: tiny", f"name: {name}")))
    assert "name (line 1)" in message
    assert "lowercase letters, digits and '-', starting with a letter" in message


def test_bad_spot(project: Path) -> None:
    message = spec_error(write(project, MINIMAL + "resources: {spot: maybe}\n"))
    assert "resources.spot (line 4)" in message
    assert '"auto"' in message


def test_negative_money(project: Path) -> None:
    message = spec_error(write(project, BLOCK.replace("max_cost_usd: 5", "max_cost_usd: -5")))
    assert "budget.max_cost_usd (line 11)" in message
    assert "> 0" in message


def test_duplicate_data_destination(project: Path) -> None:
    text = MINIMAL + "data: [{src: data, dst: ~/d}, {src: data, dst: d}]\n"
    message = spec_error(write(project, text))
    assert "data (line 4)" in message
    assert "same dst" in message


def test_several_problems_one_line_each(project: Path) -> None:
    text = "name: Bad\nworkdir: ./nope\nrun: ''\nresources: {nodes: 0, gpu: 1}\n"
    message = spec_error(write(project, text))
    lines = message.splitlines()
    assert "5 problems" in lines[0]
    body = "\n".join(lines[1:])
    for expected in [
        "name (line 1)",
        "workdir (line 2)",
        "run (line 3)",
        "resources.nodes (line 4)",
        "unknown field `resources.gpu` (line 4)",
    ]:
        assert expected in body
    assert len(lines) == 6


def test_duplicate_key(project: Path) -> None:
    message = spec_error(write(project, MINIMAL + "run: other\n"))
    assert "duplicate key `run` at line 4 (first at line 3)" in message


def test_python_tags_are_refused(project: Path) -> None:
    path = write(project, "name: x\nworkdir: .\nrun: !!python/object/apply:os.getcwd []\n")
    message = spec_error(path)
    assert "line 3" in message


def test_recursive_alias_is_refused(project: Path) -> None:
    message = spec_error(write(project, MINIMAL + "x: &a [*a]\n"))
    assert "nested deeper" in message


def test_alias_bomb_is_refused(project: Path) -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        prev = f"*a{i - 1}"
        lines.append(f"a{i}: &a{i} [{', '.join([prev] * 10)}]")
    message = spec_error(write(project, MINIMAL + "\n".join(lines) + "\n"))
    assert "more than" in message


def test_file_too_large(project: Path) -> None:
    path = write(project, MINIMAL + "# " + "x" * MAX_SPEC_BYTES + "\n")
    message = spec_error(path)
    assert "1 MiB" in message
    assert str(path) in message


@pytest.mark.parametrize(
    ("text", "got"),
    [("- a\n- b\n", "a list"), ("just text\n", "'just text'"), ("", "an empty file")],
)
def test_not_a_mapping(project: Path, text: str, got: str) -> None:
    message = spec_error(write(project, text))
    assert "must be a mapping" in message
    assert got in message


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    message = spec_error(path)
    assert str(path) in message
    assert "does not exist" in message


def test_directory_instead_of_file(tmp_path: Path) -> None:
    message = spec_error(tmp_path)
    assert str(tmp_path) in message
    assert "is a directory" in message


def test_unreadable_file(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Tests run as root, who reads any file whatever its mode, so the refusal is simulated.
    path = write(project, MINIMAL)
    real_open = Path.open

    def refuse(self: Path, *args: object, **kwargs: object) -> object:
        if self == path:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "open", refuse)
    message = spec_error(path)
    assert str(path) in message
    assert "permission denied" in message


def test_not_utf8(project: Path) -> None:
    path = project / "job.yaml"
    path.write_bytes(b"name: x\nrun: \xff\xfe\n")
    message = spec_error(path)
    assert "UTF-8" in message
    assert "line 2" in message


# --------------------------------------------------------------------------------------------
# Bad overrides: each names the flag


def test_override_error_names_the_flag(project: Path) -> None:
    message = spec_error(write(project, MINIMAL), {"resources.nodes": 0})
    assert "--nodes: must be >= 1" in message
    assert "command line" in message
    assert "line" not in message.replace("command line", "")


def test_several_override_errors(project: Path) -> None:
    overrides: dict[str, object] = {
        "resources.gpus_per_node": -1,
        "budget.max_cost_usd": "lots",
        "budget.idle_timeout": "soon",
        "provider": "AWS!",
    }
    message = spec_error(write(project, MINIMAL), overrides)
    for flag in ("--gpus:", "--max-cost:", "--idle-timeout:", "--provider:"):
        assert flag in message


def test_override_error_and_file_error_together(project: Path) -> None:
    text = MINIMAL + "resources:\n  accelerator: ''\n"
    message = spec_error(write(project, text), {"resources.nodes": 0})
    assert "--nodes: must be >= 1" in message
    assert "resources.accelerator (line 5)" in message


def test_unknown_override_key(project: Path) -> None:
    message = spec_error(write(project, MINIMAL), {"resources.gpu": 2})
    assert "unknown field `resources.gpu` (from the command line)" in message
    assert "did you mean `gpus_per_node`?" in message


def test_override_into_a_non_mapping(project: Path) -> None:
    message = spec_error(write(project, MINIMAL + "resources: 4\n"), {"resources.nodes": 2})
    assert "--nodes" in message
    assert "line 4" in message


# --------------------------------------------------------------------------------------------
# Property: any YAML-able values anywhere give a JobSpec or a SpecError, nothing else

FIELDS = {
    "": list(JobSpec.model_fields),
    "resources": ["nodes", "gpus_per_node", "accelerator", "spot", "max_price_per_hour"],
    "budget": ["max_cost_usd", "max_hourly_usd", "idle_timeout", "max_runtime"],
    "checkpoint": ["dir", "pull_every"],
    "recovery": ["max_recoveries"],
    "env": ["NCCL_DEBUG", "ORCH_X", "1X"],
}
scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=12)
    | st.sampled_from(["4h", "1h30m", "auto", ".", "~/x", "data", "0", "-1", "1e9"])
)
keys = st.sampled_from([k for names in FIELDS.values() for k in names]) | st.text(max_size=8)
values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(keys | st.integers(), children, max_size=3)
    ),
    max_leaves=12,
)
paths = st.one_of(
    st.sampled_from(FIELDS[""]).map(lambda k: (k,)),
    st.sampled_from([s for s in FIELDS if s]).flatmap(
        lambda s: st.sampled_from(FIELDS[s]).map(lambda k: (s, k))
    ),
    st.tuples(keys),
    st.tuples(keys, keys),
)


def _set(doc: dict[object, object], path: tuple[str, ...], value: object) -> None:
    target = doc
    for part in path[:-1]:
        child = target.get(part)
        if not isinstance(child, dict):
            child = target[part] = {}
        target = child
    target[path[-1]] = value


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    changes=st.lists(st.tuples(paths, values), max_size=4),
    overrides=st.dictionaries(
        st.sampled_from([*OVERRIDE_FLAGS, "workdir", "data", "env", "budget"]), values, max_size=2
    ),
)
def test_any_values_give_a_spec_or_a_spec_error(
    changes: list[tuple[tuple[str, ...], object]], overrides: dict[str, object]
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        (directory / "data").mkdir()
        doc: dict[object, object] = {"name": "prop", "workdir": ".", "run": "python train.py"}
        for path, value in changes:
            _set(doc, path, value)
        path = directory / "job.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))
        try:
            job = load_job(path, overrides)
        except SpecError as exc:
            message = str(exc)
            assert message
            assert "errors.pydantic.dev" not in message
        else:
            dumped = json.loads(json.dumps(job.spec.model_dump(mode="json")))
            assert JobSpec.model_validate(dumped) == job.spec
            assert job.workdir.is_dir()
