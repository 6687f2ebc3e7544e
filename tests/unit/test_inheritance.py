"""No class of orchestrator/ inherits from a class of another module of orchestrator/, unless
that base is an interface (an ABC with abstract methods, a Protocol) or one of the bases meant
to be extended: an exception, a pydantic model (SQLModel included), an enum. Behaviour shared
across modules is a collaborator passed in, not a mixin whose attributes the subclass must
happen to have."""

from __future__ import annotations

import abc
import enum
import importlib
import inspect
import pkgutil

import pydantic

import orchestrator

# Modules that are not imported to be looked at: `python -m` entry points run on import, and
# alembic's migration environment needs alembic's own context.
NOT_IMPORTED = ("__main__", "orchestrator.ledger.migrations")


def _extendable(base: type) -> bool:
    if issubclass(base, (BaseException, pydantic.BaseModel, enum.Enum)):
        return True
    if getattr(base, "_is_protocol", False):
        return True
    return isinstance(base, abc.ABCMeta) and inspect.isabstract(base)


def _modules() -> list[str]:
    names = [m.name for m in pkgutil.walk_packages(orchestrator.__path__, "orchestrator.")]
    return [n for n in names if not any(part in n for part in NOT_IMPORTED)]


def cross_module_bases() -> list[tuple[str, bool]]:
    """(`module.Class <- module.Base`, whether that base is meant to be extended) for each
    class whose base is a class of another orchestrator module."""
    found = []
    for name in _modules():
        module = importlib.import_module(name)
        for cls in vars(module).values():
            if not inspect.isclass(cls) or cls.__module__ != name:
                continue
            for base in cls.__bases__:
                theirs = base.__module__
                if theirs.startswith("orchestrator.") and theirs != name:
                    pair = f"{name}.{cls.__name__} <- {theirs}.{base.__name__}"
                    found.append((pair, _extendable(base)))
    return found


def test_no_class_inherits_from_another_modules_class_that_is_no_interface() -> None:
    found = [pair for pair, extendable in cross_module_bases() if not extendable]
    assert found == [], (
        "pass the base's behaviour in as a collaborator (a constructor parameter), or make "
        f"the base an ABC or a Protocol: {found}"
    )


def test_the_fence_sees_the_bases_it_allows() -> None:
    """The walk reaches the wings' modules and tells an exception base from the others."""
    found = dict(cross_module_bases())
    assert found["orchestrator.ledger.fencing.LeaseLost <- orchestrator.errors.OrchError"]
    assert "orchestrator.control.run.runner" in _modules()
