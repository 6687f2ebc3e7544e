"""What a machine of a fleet has: the one probe command orch runs there, and its parser.

`PROBE_COMMAND` is one POSIX shell command that prints labelled sections: the GPUs as
nvidia-smi lists them (index, name, total memory; nothing when nvidia-smi is absent), the CPU
count, /proc/meminfo's total, the free space of the login home (`df -Pk ~`), the version of
`python3` and of torch when either is there. Every step is bounded by `timeout` where the host
has it (a driver call stuck in nvidia-smi, a slow torch import), and a missing tool prints an
empty section.

`parse_facts` reads what came back and trusts none of it: the text and every value are bounded
(`MAX_TEXT`, `MAX_GPUS`, `MAX_NAME`, the ranges of `_bounded`), names are printable ASCII, GPU
indices are distinct, and anything else (a missing section, a line that is not what the tool
prints, a failing nvidia-smi) raises `HostFactsError` saying what was wrong; the caller names the
host. Standard library only, like every module of `node/`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

MAX_TEXT = 64 * 1024  # characters of probe output read at all
MAX_GPUS = 64
MAX_NAME = 96  # characters of a GPU name
MAX_CPUS = 16384
MAX_MEMORY_MIB = 1 << 30  # 1 PiB: no machine has more; larger is garbage
MAX_DISK_KIB = 1 << 50
MARK = "--orch-fact-"
SECTIONS = ("gpus", "cpus", "memory", "disk", "python", "torch", "end")
NO_GPU_EXITS = frozenset({6})  # nvidia-smi's "No devices were found"

_T = "$(command -v timeout >/dev/null 2>&1 && echo 'timeout 30')"
PROBE_COMMAND = "; ".join(
    [
        f"t={_T}",
        f"echo '{MARK}gpus'",
        "if command -v nvidia-smi >/dev/null 2>&1; then $t nvidia-smi"
        " --query-gpu=index,name,memory.total --format=csv,noheader,nounits 2>&1"
        f' || echo "{MARK}gpus-failed $?"; fi',
        f"echo '{MARK}cpus'",
        "nproc 2>/dev/null",
        f"echo '{MARK}memory'",
        "grep '^MemTotal:' /proc/meminfo 2>/dev/null",
        f"echo '{MARK}disk'",
        "df -Pk ~ 2>/dev/null | tail -n 1",
        f"echo '{MARK}python'",
        "$t python3 -c 'import sys; print(\"%d.%d.%d\" % sys.version_info[:3])' 2>/dev/null",
        f"echo '{MARK}torch'",
        "$t python3 -c 'import torch; print(torch.__version__)' 2>/dev/null",
        f"echo '{MARK}end'",
    ]
)

_NAME_RE = re.compile(r"^[\x20-\x7e]+$")
_PYTHON_RE = re.compile(r"^\d{1,3}\.\d{1,3}\.\d{1,3}$")
_TORCH_RE = re.compile(r"^[0-9][0-9A-Za-z.+_-]{0,63}$")


class HostFactsError(ValueError):
    """The probe's output is not what `PROBE_COMMAND` prints; the message says what was wrong."""


@dataclass(frozen=True)
class GpuFact:
    index: int
    name: str
    memory_mib: int


@dataclass(frozen=True)
class HostFacts:
    """A machine as its probe found it. `gpus` by index; () for a host without GPUs."""

    gpus: tuple[GpuFact, ...]
    cpus: int
    memory_mib: int
    disk_free_gb: float
    python: str | None
    torch: str | None


def parse_facts(text: str) -> HostFacts:
    """The facts in `text`, the output of `PROBE_COMMAND`; `HostFactsError` when it is not."""
    if len(text) > MAX_TEXT:
        raise HostFactsError(f"the probe printed more than {MAX_TEXT} characters")
    sections = _sections(text)
    return HostFacts(
        gpus=_gpus(sections["gpus"]),
        cpus=_bounded(_one(sections, "cpus"), "CPU count", 1, MAX_CPUS),
        memory_mib=_memory(_one(sections, "memory")),
        disk_free_gb=_disk(_one(sections, "disk")),
        python=_version(sections["python"], _PYTHON_RE, "python3"),
        torch=_version(sections["torch"], _TORCH_RE, "torch"),
    )


def gpus_json(gpus: tuple[GpuFact, ...]) -> str:
    """The GPUs as the ledger keeps them: a JSON list of {"index", "name", "memory_mib"}."""
    return json.dumps(
        [{"index": g.index, "name": g.name, "memory_mib": g.memory_mib} for g in gpus]
    )


def _sections(text: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    current: list[str] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith(MARK) and line[len(MARK) :] in SECTIONS:
            name = line[len(MARK) :]
            if name in found:
                raise HostFactsError(f"the probe printed its {name!r} section twice")
            current = found[name] = []
        elif current is not None and line:
            current.append(line)
        elif line:
            raise HostFactsError(f"the probe printed {_shown(line)} before its first section")
    missing = [name for name in SECTIONS if name not in found]
    if missing:
        raise HostFactsError(f"the probe's output lacks its sections {', '.join(missing)}")
    return found


def _one(sections: dict[str, list[str]], name: str) -> str:
    lines = sections[name]
    if len(lines) != 1:
        raise HostFactsError(f"the probe's {name} section has {len(lines)} lines, not 1")
    return lines[0]


def _bounded(text: str, what: str, low: int, high: int) -> int:
    if not text.isdigit() or len(text) > 20 or not low <= int(text) <= high:
        raise HostFactsError(f"{what} {_shown(text)} is not a whole number in {low}..{high}")
    return int(text)


def _gpus(lines: list[str]) -> tuple[GpuFact, ...]:
    failed = [line for line in lines if line.startswith(f"{MARK}gpus-failed")]
    if failed:
        code = failed[0].split()[-1]
        if code.isdigit() and int(code) in NO_GPU_EXITS:
            return ()
        said = next((line for line in lines if not line.startswith(MARK)), "nothing")
        raise HostFactsError(f"nvidia-smi failed (exit {_shown(code)}): {_shown(said)}")
    if len(lines) > MAX_GPUS:
        raise HostFactsError(f"nvidia-smi listed {len(lines)} GPUs; at most {MAX_GPUS} are read")
    gpus: dict[int, GpuFact] = {}
    for line in lines:
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 3:
            raise HostFactsError(f"nvidia-smi printed {_shown(line)}, not index, name, memory")
        index = _bounded(fields[0], "GPU index", 0, MAX_GPUS - 1)
        name = fields[1]
        if not name or len(name) > MAX_NAME or not _NAME_RE.match(name):
            raise HostFactsError(f"GPU {index}'s name {_shown(name)} is not a printable name")
        memory = _bounded(fields[2], f"GPU {index}'s memory (MiB)", 1, MAX_MEMORY_MIB)
        if index in gpus:
            raise HostFactsError(f"nvidia-smi listed GPU {index} twice")
        gpus[index] = GpuFact(index, name, memory)
    return tuple(gpus[i] for i in sorted(gpus))


def _memory(line: str) -> int:
    fields = line.split()
    if len(fields) != 3 or fields[0] != "MemTotal:" or fields[2] != "kB":
        raise HostFactsError(f"/proc/meminfo's total reads {_shown(line)}")
    return _bounded(fields[1], "memory (kB)", 1, MAX_MEMORY_MIB * 1024) // 1024


def _disk(line: str) -> float:
    fields = line.split()
    if len(fields) < 6:
        raise HostFactsError(f"df printed {_shown(line)}, not a filesystem line")
    free_kib = _bounded(fields[3], "free disk (KiB)", 0, MAX_DISK_KIB)
    return round(free_kib / (1024 * 1024), 2)


def _version(lines: list[str], pattern: re.Pattern[str], what: str) -> str | None:
    if not lines:
        return None
    if len(lines) != 1 or not pattern.match(lines[0]):
        raise HostFactsError(f"{what}'s version reads {_shown(' '.join(lines))}")
    return lines[0]


def _shown(text: str, limit: int = 80) -> str:
    """`text` as a message may quote it: control characters escaped, at most `limit` long."""
    cut = text[:limit] + ("..." if len(text) > limit else "")
    return repr(cut)
