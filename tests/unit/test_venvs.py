"""scripts/venvs.py: the shared venv is keyed by the Python and the pins alone, each clone's venv
by the clone's path; the supported Pythons are the ones pyproject.toml declares; and the unit
modules left out on Pythons without torch are exactly those that import it."""

from __future__ import annotations

import importlib.util
import sys
import tomllib
from pathlib import Path

from packaging.specifiers import SpecifierSet

from tests.support.torch_free import needs_torch, torch_tests

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("venvs", REPO / "scripts" / "venvs.py")
assert _spec and _spec.loader
venvs = importlib.util.module_from_spec(_spec)
sys.modules["venvs"] = venvs
_spec.loader.exec_module(venvs)

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def test_two_clones_have_venvs_of_their_own_over_one_shared_venv(tmp_path: Path) -> None:
    a, b = tmp_path / "clone-a", tmp_path / "clone-b"
    a.mkdir(), b.mkdir()
    assert venvs.clone_key(a, "main") != venvs.clone_key(b, "main")
    assert venvs.clone_key(a, "main") == venvs.clone_key(tmp_path / "x" / ".." / "clone-a", "main")
    assert venvs.clone_key(a, "main") != venvs.clone_key(a, "py3.12")
    reqs = venvs.requirements(PYPROJECT, with_torch=True)
    # nothing of the clone's path goes into the shared key
    assert venvs.shared_key("3.11.7", reqs) == venvs.shared_key("3.11.7", list(reversed(reqs)))
    assert venvs.shared_key("3.11.7", reqs) != venvs.shared_key("3.11.8", reqs)
    assert venvs.shared_key("3.11.7", reqs) != venvs.shared_key("3.11.7", reqs[1:])
    assert venvs.shared_key("3.12.1", reqs).startswith("py3.12-")
    shared = tmp_path / "shared"
    assert venvs.layer_record(a, shared, b"x") != venvs.layer_record(b, shared, b"x")
    assert venvs.layer_record(a, shared, b"x") != venvs.layer_record(a, shared, b"y")


def test_the_main_venv_gets_the_exact_torch_and_the_others_none() -> None:
    main = venvs.requirements(PYPROJECT, with_torch=True)
    assert {"torch==2.14.1", "torchvision==0.29.1"} <= set(main)
    others = venvs.requirements(PYPROJECT, with_torch=False)
    assert not [r for r in others if r.startswith("torch")]
    assert set(PYPROJECT["project"]["dependencies"]) <= set(others)


def test_every_supported_python_is_declared() -> None:
    project = PYPROJECT["project"]
    allowed = SpecifierSet(project["requires-python"])
    for minor in (venvs.MAIN_PYTHON, *venvs.OTHER_PYTHONS):
        assert f"{minor}.0" in allowed
        assert f"Programming Language :: Python :: {minor}" in project["classifiers"]
    assert "3.14.0" not in allowed  # not tested: not claimed


def test_cache_root_follows_the_environment() -> None:
    assert venvs.cache_root({"ORCH_VENV_CACHE": "/c", "HOME": "/h"}) == Path("/c")
    assert venvs.cache_root({"XDG_CACHE_HOME": "/x", "HOME": "/h"}) == Path("/x/orch-venv")
    assert venvs.cache_root({"HOME": "/h"}) == Path("/h/.cache/orch-venv")


def test_shared_commands_are_rewritten_to_the_clone_python() -> None:
    shared, own = "/s/bin/python", "/c/bin/python"
    script = b"#!/s/bin/python\nimport sys\nfrom torch.distributed.run import main\n"
    assert venvs.command_text(script, shared, own) == (
        b"#!/c/bin/python\nimport sys\nfrom torch.distributed.run import main\n"
    )
    long_form = b"#!/bin/sh\n'''exec' \"/s/bin/python\" \"$0\" \"$@\"\n' '''\nimport sys\n"
    assert venvs.command_text(long_form, shared, own) == (
        b"#!/bin/sh\n'''exec' \"/c/bin/python\" \"$0\" \"$@\"\n' '''\nimport sys\n"
    )
    assert venvs.command_text(b"\x7fELF\x02\x01", shared, own) is None
    assert venvs.command_text(b"#!/other/bin/python\n", shared, own) is None


def test_the_modules_left_out_without_torch_are_those_that_import_it(tmp_path: Path) -> None:
    left_out = {p.name for p in torch_tests(REPO / "tests" / "unit")}
    assert {"test_trainer_parts.py", "test_checkpoint_agent.py"} <= left_out  # top, in a function
    assert "test_venvs.py" not in left_out
    assert "test_layers.py" not in left_out
    # through a module of the repository, at any depth
    (tmp_path / "helpers").mkdir()
    (tmp_path / "helpers" / "__init__.py").write_text("")
    (tmp_path / "helpers" / "deep.py").write_text("def f():\n    import torchvision\n")
    (tmp_path / "helpers" / "plain.py").write_text("import json\nfrom helpers import plain\n")
    (tmp_path / "test_a.py").write_text("from helpers.deep import f\n")
    (tmp_path / "test_b.py").write_text("from helpers import plain\nimport os\n")
    (tmp_path / "test_c.py").write_text(
        "import importlib\nimportlib.import_module('helpers.deep')\n"
    )
    assert needs_torch(tmp_path / "test_a.py", tmp_path)
    assert needs_torch(tmp_path / "test_c.py", tmp_path)
    assert not needs_torch(tmp_path / "test_b.py", tmp_path)
