"""The fence: which module of `orchestrator/` may import what (see docs/architecture.md).

Every import counts, at any depth of a module (inside functions too), read from the source
(nothing is imported). Imports under `if TYPE_CHECKING:` count for the library rules but not for
the wing arrows, since they never run. Today's breaches are listed in `EXCEPTIONS`, each with its
reason; a listed exception that no longer occurs fails too, so the list only shrinks.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "orchestrator"


@dataclass(frozen=True)
class Import:
    """`module` imports `target` (a dotted module name) at `line`."""

    module: str
    target: str
    line: int
    type_checking: bool = False


@dataclass(frozen=True)
class Breach:
    rule: str
    module: str
    target: str
    line: int

    def __str__(self) -> str:
        return f"[{self.rule}] {self.module}:{self.line} imports {self.target}"


# --- reading imports ------------------------------------------------------------------------


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_package(name: str) -> bool:
    return (PACKAGE.parent.joinpath(*name.split(".")) / "__init__.py").exists()


def is_module(name: str) -> bool:
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_in_source(module: str, source: str, *, package: bool = False) -> list[Import]:
    """Every import of `module`'s source, at any depth. `from a import b` names `a.b` when
    that is a module of ours (so `from orchestrator.providers.local import kit` is `kit`)."""
    found: list[Import] = []

    def visit(node: ast.AST, type_checking: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, True)
            for child in node.orelse:
                visit(child, type_checking)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.append(Import(module, alias.name, node.lineno, type_checking))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor if package else anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                child = f"{base}.{alias.name}"
                ours = base.split(".")[0] == "orchestrator" and is_module(child)
                found.append(Import(module, child if ours else base, node.lineno, type_checking))
        for child in ast.iter_child_nodes(node):
            visit(child, type_checking)

    visit(ast.parse(source), False)
    return found


def package_imports() -> list[Import]:
    found: list[Import] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        found += imports_in_source(name, path.read_text(), package=path.name == "__init__.py")
    return found


# --- the rules --------------------------------------------------------------------------------


def wing(name: str) -> str | None:
    """The wing of a module of ours: `orchestrator.<wing>...` (errors and config are wings of
    their own; the root package is `orchestrator`); None for any other module."""
    parts = name.split(".")
    if parts[0] != "orchestrator":
        return None
    return parts[1] if len(parts) > 1 else "orchestrator"


def within(name: str, *prefixes: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def library_rule(libraries: tuple[str, ...], home: str | None) -> Callable[[Import], bool]:
    """Breached when a module outside `home` (None: every module) imports one of `libraries`."""

    def breached(imp: Import) -> bool:
        return imp.target.split(".")[0] in libraries and (
            home is None or not within(imp.module, home)
        )

    return breached


# A fleet's machines are reached over SSH and their allocations are claims in the ledger: the
# fleet provider (providers/ssh/) is the one provider that may use both.
FLEET_PROVIDER = "orchestrator.providers.ssh"


def providers_and_remote(imp: Import) -> bool:
    return (
        within(imp.module, "orchestrator.providers")
        and not within(imp.module, FLEET_PROVIDER)
        and within(imp.target, "orchestrator.remote")
    ) or (
        within(imp.module, "orchestrator.remote") and within(imp.target, "orchestrator.providers")
    )


def providers_and_ledger(imp: Import) -> bool:
    return (
        within(imp.module, "orchestrator.providers")
        and not within(imp.module, FLEET_PROVIDER)
        and within(imp.target, "orchestrator.ledger")
    )


PURE_MODULES = ("orchestrator.spec", "orchestrator.spot", "orchestrator.control.money.stop_rules",
                "orchestrator.control.run.recovery_rules",
                "orchestrator.control.money.team_budget")  # fmt: skip
PURE_EXEMPT = ("orchestrator.spot.driver",)  # the live driver reads and writes the ledger


# What a pure rule must not reach: the ledger, a provider (its I/O), or the registry that builds
# one. The providers' plain data (base's dataclasses, traces) is fair game.
IMPURE = ("orchestrator.ledger", "orchestrator.providers.aws", "orchestrator.providers.local",
          FLEET_PROVIDER)  # fmt: skip


def pure_rules(imp: Import) -> bool:
    return (
        within(imp.module, *PURE_MODULES)
        and not within(imp.module, *PURE_EXEMPT)
        and (within(imp.target, *IMPURE) or imp.target == "orchestrator.providers")
    )


# The sandbox's hosts run containers as local nodes do: it may use their runtime's module too.
SANDBOX_USES = ("orchestrator.providers.local.kit", "orchestrator.providers.local.containers")


def sandbox_uses_the_kit(imp: Import) -> bool:
    return (
        within(imp.module, "orchestrator.sandbox")
        and within(imp.target, "orchestrator.providers.local")
        and imp.target not in SANDBOX_USES
    )


# Wing -> the wings it may import (at run time). Derived from the code; acyclic (checked).
# A new arrow is a design decision: add it here, and to docs/architecture.md, on purpose.
ALLOWED: dict[str, frozenset[str]] = {
    "orchestrator": frozenset(),
    "atomic": frozenset(),
    "backoff": frozenset(),
    "errors": frozenset(),
    "job_state": frozenset(),
    "node": frozenset(),
    "spec": frozenset({"errors"}),
    "ledger": frozenset({"atomic", "errors", "job_state"}),
    "remote": frozenset({"atomic", "errors"}),
    "config": frozenset({"errors", "spec"}),
    # ledger and remote: the fleet provider's alone (`providers_and_remote`, `_and_ledger`)
    "providers": frozenset(
        {"atomic", "backoff", "config", "errors", "ledger", "node", "remote", "spec"}
    ),
    "spot": frozenset({"errors", "ledger", "node", "providers", "spec"}),
    "cluster": frozenset(
        {
            "atomic",
            "backoff",
            "config",
            "errors",
            "job_state",
            "ledger",
            "node",
            "providers",
            "remote",
            "spec",
        }
    ),
    "control": frozenset(
        {
            "atomic",
            "backoff",
            "cluster",
            "config",
            "errors",
            "host",  # HostJobs asks the controller host through its session (`host_jobs`)
            "job_state",
            "ledger",
            "node",
            "providers",
            "remote",
            "report",
            "spec",
            "spot",
        }  # fmt: skip
    ),
    "report": frozenset({"atomic", "cluster", "config", "errors", "job_state", "ledger", "spot"}),
    "sandbox": frozenset({"atomic", "config", "errors", "orchestrator", "providers"}),
    "host": frozenset(
        {
            "atomic",
            "config",
            "errors",
            "job_state",
            "node",  # the one remote write (`node/file_write.py`), for the host's files
            "orchestrator",
            "providers",
            "remote",
            "spec",
        }
    ),
    "cli": frozenset(
        {
            "atomic",
            "cluster",
            "config",
            "control",
            "errors",
            "host",
            "job_state",
            "ledger",
            "node",
            "providers",
            "report",
            "sandbox",
            "spec",
            "spot",
            "web",
        }
    ),  # fmt: skip
    # the dashboard: reads through the ledger's view, draws with report/, and builds the
    # documents the read commands print (control/verbs: fleets; control/money: the month)
    "web": frozenset(
        {"atomic", "config", "control", "errors", "host", "job_state", "ledger", "report"}
    ),
}


# The ledger hands a fleet's free slots out as the SSH provider's placement data: that one pure
# module, which imports nothing of ours (checked below), so the arrow makes no cycle.
LEDGER_USES = ("orchestrator.providers.ssh.placement",)


def arrows(imp: Import) -> bool:
    source, target = wing(imp.module), wing(imp.target)
    if imp.type_checking or source is None or target is None or source == target:
        return False
    if source == "ledger" and imp.target in LEDGER_USES:
        return False
    return target not in ALLOWED.get(source, frozenset())


# control/'s sub-wings -> those each may import (at run time); acyclic (checked). Modules at
# control/'s top (the controller process's entry point, `control/daemon.py`) may import them all.
CONTROL_ALLOWED: dict[str, frozenset[str]] = {
    "money": frozenset(),
    "process": frozenset(),
    "run": frozenset({"money", "process"}),
    "repair": frozenset({"process", "run"}),
    "verbs": frozenset({"money", "process", "run"}),
}


def control_subwing(name: str) -> str | None:
    """`run` for `orchestrator.control.run.runner`; None outside control's sub-wings."""
    parts = name.split(".")
    if parts[:2] != ["orchestrator", "control"] or len(parts) < 4:
        return None
    return parts[2]


def control_arrows(imp: Import) -> bool:
    source, target = control_subwing(imp.module), control_subwing(imp.target)
    if imp.type_checking or source is None or target is None or source == target:
        return False
    return target not in CONTROL_ALLOWED.get(source, frozenset())


RULES: dict[str, Callable[[Import], bool]] = {
    "paramiko only in remote/": library_rule(("paramiko", "fabric"), "orchestrator.remote"),
    "typer and rich only in cli/": library_rule(("typer", "rich"), "orchestrator.cli"),
    "matplotlib only in report/": library_rule(("matplotlib",), "orchestrator.report"),
    "moto only in sandbox/": library_rule(("moto",), "orchestrator.sandbox"),
    "the web framework only in web/": library_rule(
        ("starlette", "uvicorn", "jinja2"), "orchestrator.web"
    ),
    "no torch": library_rule(("torch",), None),
    "providers/ and remote/ never import each other": providers_and_remote,
    "providers/ reach the ledger only from providers/ssh/": providers_and_ledger,
    "pure rules import no ledger or provider": pure_rules,
    "the sandbox uses only the local provider's kit": sandbox_uses_the_kit,
    "wing arrows run one way": arrows,
    "control's sub-wing arrows run one way": control_arrows,
}

# Today's breaches: (rule, importing module, imported module) -> why it is still there.
EXCEPTIONS: dict[tuple[str, str, str], str] = {}


def breaches(imports: Iterable[Import]) -> Iterator[Breach]:
    """Each breach once (`from a import b, c` is one import of `a`)."""
    seen: set[Breach] = set()
    for imp, (rule, breached) in itertools.product(imports, RULES.items()):
        breach = Breach(rule, imp.module, imp.target, imp.line)
        if breached(imp) and breach not in seen:
            seen.add(breach)
            yield breach


# --- the tests --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def found() -> list[Breach]:
    return list(breaches(package_imports()))


@pytest.mark.parametrize("rule", list(RULES))
def test_the_package_keeps_the_rule(rule: str, found: list[Breach]) -> None:
    new = [
        str(b) for b in found if b.rule == rule and (b.rule, b.module, b.target) not in EXCEPTIONS
    ]
    assert not new, "\n".join(new)


def test_every_listed_exception_still_occurs(found: list[Breach]) -> None:
    seen = {(b.rule, b.module, b.target) for b in found}
    stale = [key for key in EXCEPTIONS if key not in seen]
    assert not stale, f"breaches gone: remove them from EXCEPTIONS: {stale}"


def assert_acyclic(allowed: dict[str, frozenset[str]]) -> None:
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, f"cycle: {' -> '.join((*path, name))}"
        if name in done:
            return
        for target in allowed[name]:
            visit(target, (*path, name))
        done.add(name)

    for name in allowed:
        visit(name, ())


def test_the_allowed_arrows_are_acyclic_and_name_real_wings() -> None:
    wings = {wing(module_name(p)) for p in PACKAGE.rglob("*.py")}
    assert set(ALLOWED) == wings
    assert all(targets <= wings for targets in ALLOWED.values())
    assert_acyclic(ALLOWED)


def test_what_the_ledger_uses_of_the_providers_imports_nothing_of_ours() -> None:
    for name in LEDGER_USES:
        path = PACKAGE.parent.joinpath(*name.split(".")).with_suffix(".py")
        ours = [imp for imp in imports_in_source(name, path.read_text()) if wing(imp.target)]
        assert ours == [], ours


def test_controls_sub_wings_are_acyclic_and_hold_every_module_but_the_entry_point() -> None:
    subwings = {p.name for p in (PACKAGE / "control").iterdir() if (p / "__init__.py").exists()}
    assert set(CONTROL_ALLOWED) == subwings
    assert all(targets <= subwings for targets in CONTROL_ALLOWED.values())
    assert_acyclic(CONTROL_ALLOWED)
    top = sorted(p.name for p in (PACKAGE / "control").glob("*.py"))
    assert top == ["__init__.py", "daemon.py"], top


SYNTHETIC = [
    (
        "control's sub-wing arrows run one way",
        "orchestrator.control.money.fake",
        "from orchestrator.control.run.runner import JobRunner",
    ),
    (
        "control's sub-wing arrows run one way",
        "orchestrator.control.process.fake",
        "def f():\n    from orchestrator.control.verbs import commands",
    ),
    ("paramiko only in remote/", "orchestrator.cluster.fake", "import paramiko"),
    ("paramiko only in remote/", "orchestrator.cluster.fake", "def f():\n    import fabric"),
    ("typer and rich only in cli/", "orchestrator.control.fake", "from rich.table import Table"),
    ("typer and rich only in cli/", "orchestrator.report.fake", "import typer"),
    ("matplotlib only in report/", "orchestrator.cli.fake", "import matplotlib.pyplot as plt"),
    ("moto only in sandbox/", "orchestrator.providers.aws.fake", "from moto import mock_aws"),
    (
        "no torch",
        "orchestrator.node.fake",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import torch",
    ),  # fmt: skip
    (
        "providers/ and remote/ never import each other",
        "orchestrator.providers.aws.fake",
        "from orchestrator.remote.ssh import NodeConnection",
    ),  # fmt: skip
    (
        "providers/ and remote/ never import each other",
        "orchestrator.remote.fake",
        "from orchestrator.providers.base import Instance",
    ),  # fmt: skip
    (
        "providers/ reach the ledger only from providers/ssh/",
        "orchestrator.providers.local.fake",
        "from orchestrator.ledger.store import Ledger",
    ),  # fmt: skip
    (
        "pure rules import no ledger or provider",
        "orchestrator.spot.policies",
        "def f():\n    from orchestrator.ledger.store import Ledger",
    ),  # fmt: skip
    (
        "pure rules import no ledger or provider",
        "orchestrator.spec.model",
        "from orchestrator.providers import get_provider",
    ),  # fmt: skip
    (
        "pure rules import no ledger or provider",
        "orchestrator.control.run.recovery_rules",
        "import orchestrator.providers.local.provider",
    ),  # fmt: skip
    (
        "the sandbox uses only the local provider's kit",
        "orchestrator.sandbox.fake",
        "from orchestrator.providers.local import net",
    ),  # fmt: skip
    (
        "wing arrows run one way",
        "orchestrator.ledger.fake",
        "class A:\n    def f(self):\n        from orchestrator.control import runner",
    ),  # fmt: skip
    ("wing arrows run one way", "orchestrator.remote.fake", "from ..cluster import run_watch"),
]


@pytest.mark.parametrize(("rule", "module", "source"), SYNTHETIC)
def test_the_checker_catches_a_synthetic_breach(rule: str, module: str, source: str) -> None:
    caught = list(breaches(imports_in_source(module, source)))
    assert rule in {b.rule for b in caught}, caught
    assert all((b.rule, b.module, b.target) not in EXCEPTIONS for b in caught)


@pytest.mark.parametrize(
    ("module", "source"),
    [
        ("orchestrator.spot.driver", "from orchestrator.ledger.store import Ledger"),
        ("orchestrator.remote.fake", "import paramiko"),
        ("orchestrator.sandbox.fake", "from orchestrator.providers.local import kit"),
        ("orchestrator.control.run.fake", "from orchestrator.control.money import team_caps"),
        ("orchestrator.control.daemon", "from orchestrator.control.verbs import notify"),
        (
            "orchestrator.spec.fake",
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from orchestrator.config import Settings",
        ),  # fmt: skip
    ],
)
def test_what_the_rules_allow_passes(module: str, source: str) -> None:
    assert list(breaches(imports_in_source(module, source))) == []
