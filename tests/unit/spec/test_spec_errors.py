"""The job spec errors a user sees: each names the field and its line (or flag)."""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.errors import SpecError
from orchestrator.spec.loading import load_job
from orchestrator.spec.model import (
    MAX_SPEC_BYTES,
    OVERRIDE_FLAGS,
    JobSpec,
)
from tests.support.fuzzing import examples
from tests.unit.spec_cases import (
    BLOCK,
    MINIMAL,
    spec_error,
    write,
)

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


def test_unreadable_file(project: Path) -> None:
    # Root reads any file whatever its mode, so the load runs in a child that gave root up.
    path = write(project, MINIMAL)
    path.chmod(0o600)
    message = _as_nobody(lambda: spec_error(path))
    assert str(path) in message
    assert "permission denied" in message


def _as_nobody(load: Callable[[], str]) -> str:
    """Run `load` in a forked child as user nobody; return what it returned (or raise)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop root, load, report, exit without running pytest's atexit
        code = 1
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            text = load()
            code = 0
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            text = f"{type(exc).__name__}: {exc}"
        with os.fdopen(write_end, "w") as out:
            out.write(text)
        os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end) as reply:
        text = reply.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, text
    return text


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
    max_examples=examples(150),
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
