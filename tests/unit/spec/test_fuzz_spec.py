"""Fuzzing the job spec: whatever a file or a flag holds, the answer is a spec or a clear error.

The properties: `load_job` returns a `LoadedJob` or raises `SpecError` (exit 2) whose message
names the file and, for a bad field, the field and its line; `orch submit --dry-run` (run
in-process through the real console entry point) exits 0 or 2 and never prints a traceback.
The named cases below are inputs the fuzzing once found crashing or hanging.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from orchestrator.errors import SpecError
from orchestrator.spec.loading import load_job
from orchestrator.spec.model import MAX_SPEC_BYTES, LoadedJob
from orchestrator.spec.problems import MAX_SHOWN_PROBLEMS
from tests.support.fuzzing import examples
from tests.support.in_process import run_main

FUZZ = settings(
    max_examples=examples(120),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

# A spec with every leaf field on a line of its own: (dotted field, line) -> value as written.
FULL = """\
name: fuzz-job
workdir: .
data:
  - src: ./data
    dst: ~/data
setup: echo setup
run: python train.py
resources:
  nodes: 2
  gpus_per_node: 2
  accelerator: A10G
  spot: auto
  max_price_per_hour: 3
  min_gpu_memory_gb: 16
checkpoint:
  dir: ~/ckpt
  pull_every: 60
budget:
  max_cost_usd: 5
  max_hourly_usd: 2
  idle_timeout: 10m
  max_runtime: 4h
recovery:
  max_recoveries: 2
env:
  NCCL_DEBUG: WARN
provider: local
"""

LEAVES: dict[str, int] = {
    "name": 1,
    "workdir": 2,
    "data[0].src": 4,
    "data[0].dst": 5,
    "setup": 6,
    "run": 7,
    "resources.nodes": 9,
    "resources.gpus_per_node": 10,
    "resources.accelerator": 11,
    "resources.spot": 12,
    "resources.max_price_per_hour": 13,
    "resources.min_gpu_memory_gb": 14,
    "checkpoint.dir": 16,
    "checkpoint.pull_every": 17,
    "budget.max_cost_usd": 19,
    "budget.max_hourly_usd": 20,
    "budget.idle_timeout": 21,
    "budget.max_runtime": 22,
    "recovery.max_recoveries": 24,
    "env.NCCL_DEBUG": 26,
    "provider": 27,
}

# Pieces of YAML syntax; random strings of them reach the scanner's, parser's and
# constructor's corners far more often than random characters do.
FRAGMENTS = [
    "name: ", "workdir: ", "run: ", "resources:", "env:", "data:", "budget:", "checkpoint:",
    "nodes: ", "gpus_per_node: ", "max_runtime: ", "src: ", "dst: ", "spot: ",
    "\n", "\n  ", "\n    ", "\n- ", "  ", "\t", ": ", ":", "- ", "? ", ",", "{", "}", "[", "]",
    "&a ", "*a", "&b ", "*b", "<<: ", "!!int ", "!!float ", "!!str ", "!!binary ", "!!set ",
    "!!omap ", "!!timestamp ", "!!python/object:os.system ", "!local ", "%YAML 1.1\n", "---\n",
    "...\n", "#", "|\n", ">-\n", "'", '"', "\\", "\\x00", "\\u", "~", "null", "true", "no",
    "0x1F", "0o7", "1_000", "1e9", ".inf", ".nan", "-1", "4h", "1h30m", "2001-12-14", "9" * 30,
    "é", "\u2028", "\ufeff", "\x85", "\x00", "\x1b", "\ud800",
]  # fmt: skip


def _check_outcome(path: Path, outcome: LoadedJob | SpecError) -> None:
    """The contract of load_job for any input: a checked job, or an error naming the file."""
    if isinstance(outcome, SpecError):
        message = str(outcome)
        assert outcome.exit_code == 2
        assert str(path) in message, message
        for leak in ("Traceback", "errors.pydantic.dev", "validation error", "For further"):
            assert leak not in message, message
        return
    assert outcome.workdir.is_dir()
    dumped = json.loads(json.dumps(outcome.spec.model_dump(mode="json")))
    assert type(outcome.spec).model_validate(dumped) == outcome.spec


def _load(path: Path) -> LoadedJob | SpecError:
    try:
        return load_job(path)
    except SpecError as exc:
        return exc


@pytest.fixture
def project_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        (directory / "data").mkdir()
        yield directory


# --------------------------------------------------------------------------------------------
# Files of any content


@FUZZ
@given(pieces=st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=6), max_size=40))
@example(pieces=["run: !!int abc"])
@example(pieces=["name: x\nworkdir: .\nrun: ", "9" * 5000])
@example(pieces=["x: ", "[" * 5000, "]" * 5000])
def test_yaml_made_of_random_pieces(project_dir: Path, pieces: list[str]) -> None:
    path = project_dir / "job.yaml"
    path.write_bytes("".join(pieces).encode("utf-8", errors="surrogatepass"))
    _check_outcome(path, _load(path))


@FUZZ
@given(data=st.binary(max_size=400))
def test_random_bytes(project_dir: Path, data: bytes) -> None:
    path = project_dir / "job.yaml"
    path.write_bytes(data)
    _check_outcome(path, _load(path))


@FUZZ
@given(
    edits=st.lists(
        st.tuples(
            st.integers(0, len(FULL)),
            st.integers(0, 12),
            st.sampled_from(FRAGMENTS) | st.text(max_size=4),
        ),
        min_size=1,
        max_size=4,
    )
)
def test_mutations_of_a_full_spec(project_dir: Path, edits: list[tuple[int, int, str]]) -> None:
    text = FULL
    for position, cut, insert in edits:
        position = min(position, len(text))
        text = text[:position] + insert + text[position + cut :]
    path = project_dir / "job.yaml"
    path.write_bytes(text.encode("utf-8", errors="surrogatepass"))
    _check_outcome(path, _load(path))


# --------------------------------------------------------------------------------------------
# A wrong value in any field names that field and its line, and says what is expected

_scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=8)
wrong_values = st.lists(_scalars, min_size=1, max_size=3) | st.dictionaries(
    st.text(min_size=1, max_size=5), _scalars, min_size=1, max_size=3
)


@FUZZ
@given(field=st.sampled_from(sorted(LEAVES)), value=wrong_values)
def test_a_list_or_mapping_in_any_field_names_field_and_line(
    project_dir: Path, field: str, value: object
) -> None:
    line = LEAVES[field]
    lines = FULL.splitlines()
    key = lines[line - 1].split(":", 1)[0]
    lines[line - 1] = f"{key}: {yaml.safe_dump(value, default_flow_style=True, width=10**6)}"
    path = project_dir / "job.yaml"
    path.write_text("\n".join(line.rstrip("\n") for line in lines) + "\n")
    outcome = _load(path)
    assert isinstance(outcome, SpecError), f"{field}: {value!r} was accepted"
    _check_outcome(path, outcome)
    message = str(outcome)
    assert f"{field} (line {line}): must" in message, message


def test_the_full_spec_is_valid(project_dir: Path) -> None:
    path = project_dir / "job.yaml"
    path.write_text(FULL)
    job = load_job(path)
    assert job.spec.resources.spot == "auto"


# --------------------------------------------------------------------------------------------
# What fuzzing found, kept as named cases


def _error(path: Path) -> str:
    outcome = _load(path)
    assert isinstance(outcome, SpecError), outcome
    _check_outcome(path, outcome)
    return str(outcome)


def test_explicit_tag_that_cannot_be_built_names_the_line(project_dir: Path) -> None:
    path = project_dir / "job.yaml"
    path.write_text("name: x\nworkdir: .\nrun: !!float abc\n")
    message = _error(path)
    assert "line 3" in message and "'abc' is not a valid float" in message


def test_integer_with_thousands_of_digits_names_the_line(project_dir: Path) -> None:
    path = project_dir / "job.yaml"
    path.write_text("name: x\nworkdir: .\nrun: go\nresources: {nodes: " + "9" * 5000 + "}\n")
    message = _error(path)
    assert "line 4" in message and "too many digits" in message
    assert "set_int_max_str_digits" not in message


def test_workdir_in_a_symlink_loop(project_dir: Path) -> None:
    (project_dir / "loop").symlink_to("loop")
    path = project_dir / "job.yaml"
    path.write_text("name: x\nworkdir: loop\nrun: go\n")
    message = _error(path)
    assert "workdir (line 2): cannot access" in message
    assert "symbolic links" in message


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("367d", "must be <= 31622400 s (366 days)"),
        ("1e308", "must be <= 31622400 s (366 days)"),
        ("100000000000000d", "must be <= 31622400 s (366 days)"),
    ],
)
def test_durations_beyond_the_scheduler_clock(project_dir: Path, value: str, expected: str) -> None:
    path = project_dir / "job.yaml"
    path.write_text(f"name: x\nworkdir: .\nrun: go\ncheckpoint: {{pull_every: {value}}}\n")
    assert f"checkpoint.pull_every (line 4): {expected}" in _error(path)


def test_money_that_would_print_as_infinity(project_dir: Path) -> None:
    path = project_dir / "job.yaml"
    path.write_text("name: x\nworkdir: .\nrun: go\nbudget: {max_cost_usd: 1e999999}\n")
    assert "budget.max_cost_usd (line 4): must be <= 1000000000" in _error(path)


def test_unknown_provider_names_the_field(project_dir: Path) -> None:
    path = project_dir / "job.yaml"
    path.write_text("name: x\nworkdir: .\nrun: go\nprovider: mars\n")
    assert "provider (line 4): unknown provider 'mars': choose one of local, aws" in _error(path)


def test_non_string_keys_are_shown_as_written(project_dir: Path) -> None:
    path = project_dir / "job.yaml"
    path.write_text("name: x\nworkdir: .\nrun: go\ntrue: 1\n")
    assert "true (line 4): keys must be strings, got true" in _error(path)


def test_a_thousand_problems_are_listed_up_to_a_limit(project_dir: Path) -> None:
    path = project_dir / "job.yaml"
    path.write_text("name: x\nworkdir: .\nrun: go\n" + "".join(f"k{i}: 1\n" for i in range(1000)))
    started = time.monotonic()
    message = _error(path)
    assert time.monotonic() - started < 60  # a blow-up bound, not a speed target
    assert "(1000 problems)" in message.splitlines()[0]
    assert len(message.splitlines()) == 1 + MAX_SHOWN_PROBLEMS + 1
    assert message.endswith(f"... and {1000 - MAX_SHOWN_PROBLEMS} more")


@pytest.mark.parametrize(
    "body",
    [
        "x: " + "[" * 20000 + "]" * 20000 + "\n",
        "x: " + "{a: " * 20000 + "1" + "}" * 20000 + "\n",
        "".join("  " * i + f"k{i}:\n" for i in range(600)),
        "k" * (MAX_SPEC_BYTES - 100) + ": 1\n",
    ],
    ids=["deep-lists", "deep-mappings", "deep-block", "huge-key"],
)
def test_deep_or_huge_yaml_is_refused_quickly(project_dir: Path, body: str) -> None:
    path = project_dir / "job.yaml"
    path.write_text("name: x\nworkdir: .\nrun: go\n" + body)
    started = time.monotonic()
    message = _error(path)
    assert time.monotonic() - started < 60  # as above: a blow-up, not a speed target
    assert "nested deeper" in message or "too deeply" in message or "invalid YAML" in message


# --------------------------------------------------------------------------------------------
# Files that are not files


def test_a_named_pipe_is_refused_without_waiting(project_dir: Path) -> None:
    path = project_dir / "job.yaml"
    os.mkfifo(path)
    outcome: list[LoadedJob | SpecError] = []
    reader = threading.Thread(target=lambda: outcome.append(_load(path)), daemon=True)
    reader.start()
    reader.join(timeout=10)
    if reader.is_alive():  # unblock the reader so the test process can end
        with open(path, "wb"):
            pass
        reader.join(timeout=10)
        pytest.fail("load_job waited on a named pipe with no writer")
    assert isinstance(outcome[0], SpecError)
    assert "is not a regular file (a named pipe)" in str(outcome[0])


@pytest.mark.parametrize("device", ["/dev/null", "/dev/zero", "/dev/urandom"])
def test_a_device_is_refused(device: str) -> None:
    assert stat.S_ISCHR(os.stat(device).st_mode)
    with pytest.raises(SpecError, match=r"is not a regular file \(a character device\)"):
        load_job(device)


# --------------------------------------------------------------------------------------------
# `orch submit --dry-run` with fuzzed flags, in-process through the console entry point

flag_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
    max_size=12,
) | st.sampled_from(["0", "-1", "65", "1e999", "nan", "inf", "-0", "1h", "0.5", "", " 2 "])
flags = st.fixed_dictionaries(
    {},
    optional={
        "--nodes": flag_text,
        "--gpus": flag_text,
        "--provider": flag_text.filter(lambda v: v.strip() != "aws"),
        "--max-cost": flag_text,
        "--idle-timeout": flag_text,
        "--spot": st.sampled_from(["--spot", "--no-spot"]),
        "--json": st.just("--json"),
        "--detach": st.just("--detach"),
    },
)


SWITCHES = ("--spot", "--json", "--detach")  # flags without a value


@FUZZ
@given(chosen=flags)
@example(chosen={"--detach": "--detach"})
@example(chosen={"--provider": "mars"})
@example(chosen={"--nodes": "abc", "--json": "--json"})
def test_submit_dry_run_with_any_flags(
    project_dir: Path, monkeypatch: pytest.MonkeyPatch, chosen: dict[str, str]
) -> None:
    monkeypatch.setenv("ORCH_HOME", str(project_dir / "orch"))
    monkeypatch.setenv("COLUMNS", "200")
    spec = project_dir / "job.yaml"
    spec.write_text("name: flags\nworkdir: .\nrun: python train.py\n")
    argv = ["submit", str(spec), "--dry-run"]
    for flag, value in chosen.items():
        argv += [value] if flag in SWITCHES else [flag, value]
    code, out, err = run_main(argv)
    assert "Traceback" not in out + err
    assert code in (0, 2), (argv, code, out, err)
    if code == 0:
        assert "--detach" not in argv
        if "--json" in argv:
            document = json.loads(out)
            assert document["plan"]["nodes"] >= 1
        else:
            assert "would launch" in out
        return
    # exit 2: the message names the flag (ours) or the option (the CLI parser's)
    named = ["--nodes", "--gpus", "--provider", "--max-cost", "--idle-timeout"]
    named += ["--dry-run or --detach"]
    assert any(name in err for name in named), (argv, err)
    assert not (project_dir / "orch" / "local" / "nodes").exists()
