"""This ORCH_HOME's machine id: who holds a controller lease on a shared ledger.

A random id kept in `ORCH_HOME/machine-id`, made on first use and never changed: the host's
name (for people reading it) and random hex (so two hosts of one name differ), e.g.
`gpu-box-3f9c1a2b`. One ORCH_HOME is one machine: two ORCH_HOMEs on one host are two machines
to the ledger, and an ORCH_HOME copied with its machine-id would be the same machine twice
(copy a home without that file).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
from pathlib import Path

MACHINE_ID_FILE = "machine-id"


def machine_id(home: Path) -> str:
    """The machine id of ORCH_HOME `home`, made (and written 0644) on first use. Processes
    asking at once all get the first one written."""
    path = home / MACHINE_ID_FILE
    known = _read(path)
    if known:
        return known
    home.mkdir(parents=True, exist_ok=True)
    tmp = home / f".{MACHINE_ID_FILE}.{os.getpid()}.{secrets.token_hex(4)}"
    tmp.write_text(f"{_new_id()}\n")
    try:
        os.link(tmp, path)  # never replaces an id another process wrote first
    except FileExistsError:
        pass
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()
    return _read(path) or machine_id(home)


def holder_id(machine: str, pid: int | None = None) -> str:
    """The holder of a controller lease: `machine:pid` of the controller process."""
    return f"{machine}:{os.getpid() if pid is None else pid}"


def machine_of(holder: str | None) -> str | None:
    """The machine part of a holder (`holder_id`); None when it has none."""
    if not holder or ":" not in holder:
        return None
    return holder.rsplit(":", 1)[0]


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except FileNotFoundError:
        return None


def _new_id() -> str:
    host = re.sub(r"[^A-Za-z0-9.-]+", "-", os.uname().nodename).strip("-.")[:32] or "host"
    return f"{host}-{secrets.token_hex(4)}"
