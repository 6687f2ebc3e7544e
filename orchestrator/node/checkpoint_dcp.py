"""Which files a sharded checkpoint (torch.distributed.checkpoint, DCP) is made of.

Part of the checkpoint agent (`orchestrator.node.checkpoint_agent`), in the node runtime beside it:
standard library only, Python 3.8 or newer. A DCP `.metadata` is a pickle: it is read with a
stand-in for every class it names, so nothing in it is ever run.
"""

from __future__ import annotations

import builtins
import io
import pickle

if __package__:
    from orchestrator.node.checkpoint_files import skipped
else:  # the program on a node: its modules are beside it
    from checkpoint_files import skipped


class _Stub:
    """Stands in for any class a pickle names: takes whatever it is given, runs nothing.

    Unpickling may make one without calling `__init__` (NEWOBJ), hence the class defaults."""

    args: tuple = ()
    state: object = None

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.args = args
        self.state = kwargs or None

    def __setstate__(self, state: object) -> None:
        self.state = state

    def __setitem__(self, key: object, value: object) -> None:
        self.__dict__.setdefault("items", {})[key] = value

    def append(self, value: object) -> None:
        self.__dict__.setdefault("elements", []).append(value)

    def extend(self, values: object) -> None:
        self.__dict__.setdefault("elements", []).extend(values)  # type: ignore[arg-type]


_SAFE_BUILTINS = frozenset(
    {"set", "frozenset", "list", "dict", "tuple", "bytearray", "bytes", "slice", "complex",
     "int", "float", "str", "bool", "range"}
)  # fmt: skip


class _StubUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> object:
        if module == "builtins" and name in _SAFE_BUILTINS:
            return getattr(builtins, name)
        return type(name, (_Stub,), {"__module__": "orch_stub." + module})


def dcp_files(metadata: bytes) -> dict[str, int] | None:
    """The files a DCP `.metadata` says the checkpoint holds, each with the least size it
    must have; None when the bytes cannot be read as one. Nothing in the pickle is run: every
    class it names is a stand-in."""
    try:
        root = _StubUnpickler(io.BytesIO(metadata)).load()
    except Exception:  # noqa: BLE001 - any unreadable pickle means "unknown"
        return None
    files: dict[str, int] = {}
    seen: set[int] = set()
    todo = [root]
    while todo and len(seen) < 2_000_000:
        item = todo.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, dict):
            path = item.get("relative_path")
            if isinstance(path, str):
                end = item.get("offset", 0), item.get("length", 0)
                if all(isinstance(v, int) for v in end):
                    files[path] = max(files.get(path, 0), end[0] + end[1])
            todo.extend(item.keys())
            todo.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):  # noqa: UP038 - runs on Python 3.8
            todo.extend(item)
        elif isinstance(item, _Stub):
            todo.extend([item.args, item.state, *item.__dict__.values()])
    valid = {p: n for p, n in files.items() if "/" not in p and not skipped(p)}
    return valid or None
