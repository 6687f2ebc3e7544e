"""The node runtime: every program orch runs on a node, as one versioned zipapp.

Pure: the zipapp's bytes, its version and name, and the command text that puts it on a node
and runs its programs. Nothing of orch is installed on a node, so orch sends it this one
file: `orch-node-<version>.pyz`, where the version is the start of the SHA-256 of its bytes,
built reproducibly (the same sources give the same bytes: entries in a fixed order, with
fixed times and modes). A node that holds a version already is not sent it again
(`check_command`); `install_command` checks the whole digest on the node before it puts the
file in place. On a node, under the home directory:

    orch-jobs/.node/orch-node-<version>.pyz     the runtime, shared by every job of the node

On an EC2 node the guard's copy is root's, in `guard_protocol.AWS_GUARD_DIR`, written by
cloud-init at boot.

The programs (`runtime_main.PROGRAMS`): `guard` (the node's daemon, whose events include the
spot-notice watch), `checkpoint-agent`, `set-aside`, `clear-files`, `imds`, `bucket-data`
(data between a bucket and the node) and `allocation-end` (an allocation on a shared machine
ended: its processes, key line and home), each a module
at the top of the zipapp with the modules it imports beside it and the kit they share
(`node_kit`). Standard library only,
Python 3.8 or newer (the checkpoint agent imports boto3 for an `s3://` store, and only then;
`bucket-data` for a fetch or an upload).

    python3 -u orch-node-<version>.pyz PROGRAM [ARGUMENTS...]
"""

from __future__ import annotations

import base64
import functools
import hashlib
import io
import shlex
import zipfile
from pathlib import Path

from orchestrator.node import bucket_data, checkpoint_agent, guard, runtime_main
from orchestrator.node.launch import home_expr
from orchestrator.node.source_text import compact_source

FOLDER = "orch-jobs/.node"  # home-relative: beside the jobs' folders, which no job may name
HAVE_MARK = "@@orch-node-have"
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # the earliest a zip can say: no build time in the bytes

# What the zipapp holds besides `__main__.py`: each program's file and the modules it
# imports from beside it.
MODULES = tuple(
    sorted(
        {
            "guard.py", *guard.MODULES,
            "checkpoint_agent.py", *checkpoint_agent.MODULES,
            "set_aside.py", "clear_files.py", "imds_server.py",
            "bucket_data.py", *bucket_data.MODULES,
            "allocation_end.py",
            "node_kit.py",
        }
    )
)  # fmt: skip


def sources() -> dict[str, str]:
    """The zipapp's files as text: name -> source without comments or docstrings
    (`compact_source`), `__main__.py` first."""
    folder = Path(runtime_main.__file__).parent
    files = {"__main__.py": compact_source(Path(runtime_main.__file__).read_text())}
    for name in MODULES:
        files[name] = compact_source((folder / name).read_text())
    return files


@functools.cache
def build() -> bytes:
    """The zipapp's bytes: the same for the same sources."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for name, text in sources().items():
            info = zipfile.ZipInfo(name, date_time=_ZIP_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            info.create_system = 3  # unix, whatever builds it
            archive.writestr(info, text.encode(), compresslevel=9)
    return out.getvalue()


def digest() -> str:
    """The SHA-256 of the zipapp's bytes (hex)."""
    return hashlib.sha256(build()).hexdigest()


def version() -> str:
    return digest()[:16]


def file_name() -> str:
    return f"orch-node-{version()}.pyz"


def node_path() -> str:
    """Where the runtime lies on a node (home-relative)."""
    return f"{FOLDER}/{file_name()}"


def program_command(program: str, *args: str, path: str | None = None) -> str:
    """Shell text that runs `program` of the runtime at `path` (default: `node_path`) with
    `args`, unbuffered."""
    if program not in runtime_main.PROGRAMS:
        raise ValueError(f"no node program {program!r}")
    where = home_expr(path or node_path())
    return f"python3 -u {where} {shlex.join([program, *args])}"


def check_command() -> str:
    """Print `HAVE_MARK` when the node holds this version of the runtime (`has_runtime`)."""
    return f"if [ -f {home_expr(node_path())} ]; then echo {HAVE_MARK}; fi"  # exits 0 either way


def has_runtime(output: str) -> bool:
    return HAVE_MARK in output.split()


# Reads the zipapp in base64 (stdin), checks its SHA-256 and puts it in place whole: a new
# file made by mkstemp beside it (never an existing file or a link put there), renamed over.
_INSTALL = (
    "import base64, hashlib, os, sys, tempfile\n"
    "path, want = sys.argv[1], sys.argv[2]\n"
    "data = base64.b64decode(sys.stdin.read())\n"
    "if hashlib.sha256(data).hexdigest() != want:\n"
    "    sys.exit('the node runtime arrived damaged')\n"
    "os.makedirs(os.path.dirname(path), exist_ok=True)\n"
    "fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix='.tmp-')\n"
    "with os.fdopen(fd, 'wb') as out:\n"
    "    out.write(data)\n"
    "os.chmod(tmp, 0o644)\n"
    "os.replace(tmp, path)\n"
)


def install_command() -> str:
    """Put the runtime on the node (stdin: `install_input()`), whole and checked."""
    where = home_expr(node_path())
    return f"python3 -c {shlex.quote(_INSTALL)} {where} {digest()}"


def install_input() -> str:
    return base64.b64encode(build()).decode()
