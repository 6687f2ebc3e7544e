"""The wheel of this very orch, built locally, that a controller host installs.

Built from the source tree this orch runs from (`pip wheel --no-deps --no-build-isolation`,
offline) in a scratch copy, so the checkout gets no `build/` or `.egg-info`. Facts about the
"image" the host was booted from are read here too: a local node sees this machine's files, so
the base interpreter and the folders holding orch's dependencies are the same paths there.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import orchestrator
from orchestrator.errors import ControllerHostError

SOURCES = ("pyproject.toml", "README.md", "orchestrator", "orch_trainer", "trainer")


def source_tree() -> Path:
    """The project folder this orch was imported from; raises when it is not a source tree."""
    root = Path(orchestrator.__file__).resolve().parents[1]
    if not (root / "pyproject.toml").exists():
        raise ControllerHostError(
            f"orch runs from {root}, not from a source checkout: no wheel can be built here",
            hint="run `orch controller up` from a checkout of orch (pip install -e .)",
        )
    return root


def build_wheel(out: Path) -> Path:
    """Build orch's wheel into `out`; returns the wheel file. Raises with pip's output."""
    root = source_tree()
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="orch-wheel-") as scratch:
        tree = Path(scratch) / "src"
        tree.mkdir()
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
        for name in SOURCES:
            source = root / name
            if source.is_dir():
                shutil.copytree(source, tree / name, ignore=ignore)
            elif source.exists():
                shutil.copy2(source, tree / name)
        for old in out.glob("orch-*.whl"):
            old.unlink()
        done = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
             "--no-index", "--quiet", "--disable-pip-version-check", "-w", str(out), str(tree)],
            capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False,
        )  # fmt: skip
    wheels = sorted(out.glob("orch-*.whl"))
    if done.returncode != 0 or not wheels:
        raise ControllerHostError(
            f"building orch's wheel failed:\n{(done.stdout + done.stderr)[-2000:]}",
            hint="check that setuptools and wheel are installed in orch's venv",
        )
    return wheels[-1]


def image_python() -> str:
    """The base interpreter of this venv: what a host booted from the same image runs."""
    return str(Path(getattr(sys, "_base_executable", sys.executable)))


def image_site_dirs() -> list[str]:
    """Folders outside this venv that hold orch's dependencies (shared with local nodes)."""
    own = sysconfig.get_path("purelib")
    base = sysconfig.get_path("purelib", vars={"base": sys.base_prefix})
    return [
        p
        for p in sys.path
        if p.endswith("site-packages") and p not in (own, base) and Path(p).is_dir()
    ]


def image_bin_dirs() -> list[str]:
    """Where this venv keeps its programs (torchrun, ...): on a host booted from the same
    image, after the host's own venv on its PATH."""
    return [str(Path(sys.prefix) / "bin")]
