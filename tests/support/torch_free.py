"""Which unit test modules need torch: those that import torch or torchvision anywhere (inside
functions too, or by a literal `import_module` name), directly or through a module of this
repository (the trainer's, the tests' support). The orchestrator's modules are not followed: it
never imports torch (a run without torch would show it if it did).

The other supported Pythons' venvs have no torch (the orchestrator never imports it), so
`scripts/test.sh` runs tests/unit on them without these modules:

    python -m tests.support.torch_free      prints one `--ignore=PATH` pytest argument a line

Standard library only, so that any of those Pythons runs it.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TORCH = frozenset({"torch", "torchvision"})
UNFOLLOWED = frozenset({"orchestrator"})  # never imports torch


def imported_modules(source: str) -> set[str]:
    """Every module a source file imports, at any depth (`from a import b` gives a and a.b,
    since b may be a module), `importlib.import_module("a.b")` with a literal name included."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Call) and _call_name(node.func) == "import_module":
            first = node.args[0] if node.args else None
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                names.add(first.value)
    return names


def _call_name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else None


def module_file(name: str, root: Path) -> Path | None:
    """The file of a module of this repository, None for one from elsewhere."""
    base = root.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def needs_torch(path: Path, root: Path = ROOT) -> bool:
    """Whether importing and running this file's code imports torch or torchvision."""
    todo, seen = [path.resolve()], {path.resolve()}
    while todo:
        for name in imported_modules(todo.pop().read_text()):
            if name.split(".")[0] in TORCH:
                return True
            parts = name.split(".")
            if parts[0] in UNFOLLOWED:
                continue
            # a package's __init__ runs before any of its modules
            for i in range(1, len(parts) + 1):
                file = module_file(".".join(parts[:i]), root)
                if file is not None and file not in seen:
                    seen.add(file)
                    todo.append(file)
    return False


def torch_tests(unit_dir: Path) -> list[Path]:
    """The test modules of `unit_dir` that need torch, sorted."""
    return sorted(p for p in unit_dir.rglob("test_*.py") if needs_torch(p))


def main() -> int:
    for path in torch_tests(ROOT / "tests" / "unit"):
        print(f"--ignore={path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
