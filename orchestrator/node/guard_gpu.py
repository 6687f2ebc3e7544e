"""The guard's reading of the node's GPUs (`orchestrator.node.guard`): nvidia-smi's
utilization of each GPU, of the node's own GPUs only where it has a share of the machine's.

Standard library only, Python 3.8 or newer (in the node runtime beside `guard.py`).
"""

import shutil
import subprocess

NVIDIA_SMI_ARGS = ["--query-gpu=index,utilization.gpu", "--format=csv,noheader,nounits"]


def gpu_indices(value):
    """The terms' `gpu_indices` (the machine's GPUs this node may use) as a set; None (every
    GPU) when absent or not a list of whole numbers."""
    if not isinstance(value, list) or len(value) > 4096:
        return None
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value):
        return None
    return set(value)


def gpu_utilizations(timeout_s, indices=None):
    """Utilization of every GPU by nvidia-smi, or of those of `indices` only (a node's share
    of a shared machine: another job's GPUs never count); None when there is no usable
    reading."""
    binary = shutil.which("nvidia-smi")
    if binary is None:
        return None
    try:
        out = subprocess.run(
            [binary] + NVIDIA_SMI_ARGS,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    values = []
    for line in out.stdout.decode("utf-8", "replace").splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 2 or not parts[0].isdigit():
            continue
        if indices is not None and int(parts[0]) not in indices:
            continue
        try:
            values.append(float(parts[1]))
        except ValueError:
            return None  # "[N/A]": unknown, never idle
    return values or None
