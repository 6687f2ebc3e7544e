"""What a benchmark run's figures were measured on: the machine's cores, memory, kernel, Python,
torch and the commit, and its load (`bench.run_all` writes them above the figures)."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _meminfo_gib() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) / 2**20:.1f} GiB"
    except OSError:
        pass
    return "unknown"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _commit() -> str:
    found = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    )
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=REPO, capture_output=True, text=True,
    )  # fmt: skip
    if found.returncode != 0:
        return "unknown"
    return found.stdout.strip() + (" (with uncommitted changes)" if dirty.stdout.strip() else "")


def load_average() -> str:
    try:
        return ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def machine_facts() -> dict[str, str]:
    """What the figures were measured on."""
    return {
        "CPU": f"{os.cpu_count()} cores ({_cpu_model()})",
        "RAM": _meminfo_gib(),
        "kernel": f"{platform.system()} {platform.release()}",
        "Python": platform.python_version(),
        "torch": _version("torch"),
        "orch commit": _commit(),
    }
