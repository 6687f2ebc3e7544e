"""Why a run failed, read out of a node log (pure).

torchrun's own report of a failed child (`ChildFailedError ... bash FAILED`) names the rank
that failed first and its exit code, but not what went wrong: a script that does not use
torch.distributed.elastic's `@record` leaves no error file, and orch runs the user's command as
`torchrun --no-python bash -c RUN`. What went wrong is in the failing rank's own output, which
torchrun tees into the node log with a `[default<local rank>]:` prefix: its last traceback ends
with the exception line (`RuntimeError: CUDA out of memory ...`). `find_failure` picks that line;
`failure_report` puts it first, above the log's tail. A script that set up torch.distributed
prints its uncaught exception with torch's own `[rank<global rank>]: ` prefix as well, which
is taken off. On several nodes, the node whose torchrun saw a failure first holds the cause;
the others' ranks mostly fail because a peer went away (`cluster_failure`).

A rank that fails before its script runs prints no exception but one line of its own (python's
`can't open file '...'`, `No module named ...`, bash's `command not found`): that line is the
error. A rank whose own output is nothing but its error (such a line, or an exception raised
at startup, as a ModuleNotFoundError at import) failed before its first line of output: its
report leaves torchrun's own traceback (its ChildFailedError) to the log (`orch logs`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from orchestrator.node.progress import local_rank_line, rank_lines

TAIL_LINES = 30  # lines of the node log shown under the failure
TRACEBACK_LINES = 20  # at most this many lines of the failing rank's traceback

_ROOT_CAUSE = "Root Cause (first observed failure):"
_REPORT_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)")
_REPORT_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")
_TRACEBACK = "Traceback (most recent call last):"
# An exception line outside a traceback block: a dotted name ending in Error, Exception,
# Interrupt or Exit, alone or with `: message`.
_EXCEPTION_LINE = re.compile(
    r"^(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Interrupt|Exit)(?::.*)?$"
)
_LAUNCHER_ERROR = "ChildFailedError"  # torchrun's own exception, never the script's
# The one line a process prints when it fails before its script runs: python without its
# script or module, bash without the program or directory named.
_STARTUP_ERROR = re.compile(
    r"can't open file|No module named |Error while finding module specification"
    r"|: command not found$|: No such file or directory$|: Permission denied$|: not found$"
)
_ORCH_LINE = "[orch] "  # the launch script's own lines (setup running, failed, skipped)
_TORCH_RANK_PREFIX = re.compile(r"^\[rank\d+\]: ?")  # torch.distributed's, on stderr
# torchrun's (glog) line as it sees a worker fail: `E1204 19:10:35.510000 PID file:line] failed
# (exitcode: -6) local_rank: 1 ...`; month, day and time to the microsecond.
_FAILED_AT = re.compile(r"^E(\d{4}) (\d\d:\d\d:\d\d\.\d+) .*\] failed \(exitcode: ")
# A rank's error when a peer it talks to went away (gloo's and NCCL's words for it).
_PEER_LOSS = re.compile(
    r"Connection (?:reset|closed) by peer|Broken pipe|remote process exited|"
    r"Socket Timeout|NCCL communicator was aborted",
    re.IGNORECASE,
)
SIGABRT_EXIT = -6
# Control characters (but tab and newline) a node log may hold: a report reaches the terminal
# and the ledger, which get neither a node's escape sequences nor a NUL (as `remote.lines`).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# What the C++ runtime prints as it aborts a process whose std::thread is still joinable: with
# gloo, a rank ending through normal interpreter shutdown sometimes dies this way after its
# last line of Python has run.
_TERMINATE = "terminate called without an active exception"
EXIT_ABORT_HINT = (
    "hint: the process aborted while it shut down, possibly after its work was done; with "
    "gloo, call torch.distributed.destroy_process_group() and end the script with "
    "os._exit(status) after flushing its output (docs/spot.md, 'The trainer contract')"
)


@dataclass(frozen=True)
class Failure:
    """What a node log says about its failed run; every field may be unknown."""

    local_rank: int | None  # the failing process's local rank on its node
    rank: int | None  # its global rank, from torchrun's report
    exit_code: int | None  # its exit code, from torchrun's report (negative: killed by a signal)
    error: str | None  # its last exception line, e.g. "RuntimeError: boom"
    traceback: tuple[str, ...] = ()  # the traceback that ends with `error` (last lines)
    early: bool = False  # its own output is only its error: it failed before printing anything


def _root_cause(lines: list[str]) -> tuple[int | None, int | None, int | None]:
    """(global rank, local rank, exit code) from torchrun's last ChildFailedError report."""
    rank = local = code = None
    starts = [i for i, line in enumerate(lines) if line.strip() == _ROOT_CAUSE]
    if not starts:
        return None, None, None
    for line in lines[starts[-1] + 1 :]:
        if line.startswith("="):
            break
        if (match := _REPORT_RANK.match(line)) is not None:
            rank, local = int(match.group(1)), int(match.group(2))
        elif (match := _REPORT_EXIT.match(line)) is not None:
            code = int(match.group(1))
    return rank, local, code


def last_exception(lines: list[str]) -> tuple[str | None, tuple[str, ...]]:
    """The last exception line in one process's output and the traceback that ends with it.

    A traceback block is `Traceback (most recent call last):`, indented frame lines, then the
    exception line at the left margin. Without a block, the last line that looks like an
    exception (`ValueError: ...`) counts, with no traceback. torchrun's own ChildFailedError
    is never the answer.
    """
    error: str | None = None
    traceback: tuple[str, ...] = ()
    block: int | None = None  # index of the open block's `Traceback` line
    for i, line in enumerate(lines):
        if line.startswith(_TRACEBACK):
            block = i
            continue
        if block is not None and line[:1].isspace():
            continue  # a frame line of the open block
        text = line.strip()
        if _LAUNCHER_ERROR in text:
            block = None
        elif block is not None and text:
            error, traceback = text, tuple(lines[max(block, i + 1 - TRACEBACK_LINES) : i + 1])
            block = None
        elif _EXCEPTION_LINE.match(text):
            error, traceback = text, ()
    return error, traceback


def find_failure(log_text: str) -> Failure | None:
    """The failing process of a node log: the rank torchrun's report names as the root cause,
    else the last rank (or, in a log without rank prefixes, the log itself) that printed an
    exception. None when the log names neither a failing rank nor an exception."""
    lines = log_text.splitlines()
    rank, local, code = _root_cause(lines)
    if local is not None:
        own = _own_lines(log_text, local)
        error, traceback = _own_error_line(own)
        if error is None and code == SIGABRT_EXIT and any(_TERMINATE in line for line in own):
            error = f"aborted (SIGABRT): {_TERMINATE}"
        return Failure(local, rank, code, error, traceback, _early(own, error))
    last_rank: int | None = None
    for line in reversed(lines):
        local_rank, text = local_rank_line(line)
        text = _TORCH_RANK_PREFIX.sub("", text)
        if local_rank is not None and last_exception([text])[0] is not None:
            last_rank = local_rank
            break
    if last_rank is not None:
        own = _own_lines(log_text, last_rank)
        error, traceback = last_exception(own)
        return Failure(last_rank, None, None, error, traceback, _early(own, error))
    if any(local_rank_line(line)[0] is not None for line in lines):
        return None
    error, traceback = _own_error_line(lines)
    return Failure(None, None, None, error, traceback) if error else None


def _own_error_line(lines: list[str]) -> tuple[str | None, tuple[str, ...]]:
    """`last_exception` of a process's lines, else its last line when that is the error of a
    process that failed before its script ran (`_STARTUP_ERROR`); orch's own lines aside."""
    error, traceback = last_exception(lines)
    if error is not None:
        return error, traceback
    said = [line.strip() for line in lines if line.strip() and not line.startswith(_ORCH_LINE)]
    if said and _STARTUP_ERROR.search(said[-1]):
        return said[-1], ()
    return None, ()


def _early(own: list[str], error: str | None) -> bool:
    """Whether a process whose error is `error` printed nothing before it: its first line is
    its error line or the start of a traceback."""
    first = next((line.strip() for line in own if line.strip()), None)
    return error is not None and first in (error, _TRACEBACK)


def _own_lines(log_text: str, local_rank: int) -> list[str]:
    """One local rank's lines without torchrun's prefix nor torch.distributed's."""
    return [_TORCH_RANK_PREFIX.sub("", line) for line in rank_lines(log_text, local_rank)]


def failed_at(log_text: str) -> str | None:
    """When torchrun last saw a worker fail, as `MMDD HH:MM:SS.ffffff` (sortable within a
    year), or None when the log shows no such failure."""
    found = None
    for line in log_text.splitlines():
        if (match := _FAILED_AT.match(line)) is not None:
            found = f"{match.group(1)} {match.group(2)}"
    return found


def peer_lost(log_text: str) -> bool:
    """Whether the failing rank of a node log failed only because a peer went away (its error
    is a closed or reset connection, as gloo and NCCL report a rank that died)."""
    failure = find_failure(log_text)
    return failure is not None and bool(failure.error and _PEER_LOSS.search(failure.error))


def _own_error(log_text: str) -> bool:
    failure = find_failure(log_text)
    return failure is not None and bool(failure.error and not _PEER_LOSS.search(failure.error))


def cluster_failure(logs: Mapping[int, str], rank: int, exit_code: int | None) -> tuple[int, str]:
    """(node, reason) of a failed run, from every node's log (`logs`: node -> the end of its
    log): node `rank` exited with `exit_code`, but the node whose torchrun saw a worker fail
    first holds the cause, so it is that node's report (node `rank`'s when no log says).

    When that node's rank failed only because a peer went away (`peer_lost`), a node whose
    rank failed of its own is the cause instead (the earliest seen, else the lowest): which
    torchrun notices first is a race of milliseconds on a loaded machine, and the peer may
    not even have printed its torchrun's report yet."""
    times = {node: at for node, text in logs.items() if (at := failed_at(text)) is not None}
    first = min(times, key=lambda node: (times[node], node)) if times else rank
    if peer_lost(logs.get(first, "")):
        own = [node for node, text in logs.items() if _own_error(text)]
        if own:
            first = min(own, key=lambda node: (times.get(node, "~"), node))
    exited = f"torchrun exited with code {exit_code}"
    if first == rank or (first in times and times.get(rank) == times[first]):
        return rank, failure_report(rank, exited, logs.get(rank, ""))
    seen = f", at {times[first][5:]}" if first in times else ""
    what = f"a worker failed here first{seen} (node {rank}: {exited})"
    return first, failure_report(first, what, logs[first])


def failure_report(node: int, what: str, log_text: str) -> str:
    """The reason a run failed on node `node`: the failing rank's own exception line first
    (when the log holds one), then `what` happened (e.g. "torchrun exited with code 1"),
    that rank's traceback, and the last `TAIL_LINES` lines of the node log. Control characters
    (but tab and newline) are replaced by U+FFFD."""
    failure = find_failure(log_text)
    lines = log_text.rstrip().splitlines()
    trimmed = failure is not None and failure.early and _without_launcher_trace(lines) != lines
    if trimmed:
        lines = _without_launcher_trace(lines)
    tail = "\n".join(lines[-TAIL_LINES:])
    parts: list[str] = []
    if failure is not None and failure.error is not None:
        who = _who(node, failure)
        parts.append(f"{who}: {failure.error}")
        if _TERMINATE in failure.error and failure.exit_code == SIGABRT_EXIT:
            parts.append(EXIT_ABORT_HINT)
    parts.append(f"node {node}: {what}")
    if failure is not None and failure.traceback:
        parts.append(f"--- {_who(node, failure)}'s traceback ---")
        parts.extend(failure.traceback)
    left_out = ", torchrun's own traceback left out (orch logs shows it)" if trimmed else ""
    parts.append(f"--- last lines of node {node}'s log{left_out} ---")
    parts.append(tail)
    return _CONTROL.sub("\ufffd", "\n".join(parts))


def _without_launcher_trace(lines: list[str]) -> list[str]:
    """A node log's lines without torchrun's own traceback and failure report (from its
    `Traceback` line to the `====` line that closes its ChildFailedError report), the last
    one; the lines as they are when there is none."""
    raised = [i for i, line in enumerate(lines) if _LAUNCHER_ERROR in line and line[:1] != "["]
    if not raised:
        return lines
    start = next(
        (i for i in range(raised[-1], -1, -1) if lines[i].startswith(_TRACEBACK)), raised[-1]
    )
    closes = [i for i in range(raised[-1] + 1, len(lines)) if lines[i].startswith("=")]
    end = closes[1] if len(closes) >= 2 else len(lines) - 1  # the report opens and closes so
    return lines[:start] + lines[end + 1 :]


def _who(node: int, failure: Failure) -> str:
    if failure.rank is not None:
        return f"rank {failure.rank} (node {node})"
    if failure.local_rank is not None:
        return f"node {node}, local rank {failure.local_rank}"
    return f"node {node}"


# What a failure to load a checkpoint looks like in the failing rank's traceback: a frame of
# torch.load, of DCP's loader or of safetensors' loading, or a function of the script's own
# whose name says it loads a checkpoint (`load_checkpoint`, `resume_from_ckpt`); or an
# exception line in the words these libraries use.
_LOAD_FRAME = re.compile(
    r'File ".*(?:torch/serialization\.py", line \d+, in (?:load|_load)\b'
    r"|torch/distributed/checkpoint/state_dict_loader\.py\""
    r"|torch/distributed/checkpoint/filesystem\.py\", line \d+, in read_"
    r'|safetensors/[^"]*", line \d+, in load'
    r'|", line \d+, in (?=\w*(?:checkpoint|ckpt))(?=\w*(?:load|restore|resume))\w+$)',
    re.IGNORECASE,
)
_LOAD_ERROR = re.compile(
    r"metadata read failed|PytorchStreamReader failed|failed finding central directory"
    r"|Error\(s\) in loading state_dict|UnpicklingError|SafetensorError"
    r"|(?:load|read|restor)\w* (?:the |a )?(?:checkpoint|ckpt)"
    r"|(?:checkpoint|ckpt)\w* (?:could not|cannot|can't) be (?:loaded|read)",
    re.IGNORECASE,
)
_TAIL_MARK = "\n--- last lines of node "


def checkpoint_load_error(report: str) -> str | None:
    """The failing rank's exception line when a run's failure (`failure_report`'s text) reads
    as a checkpoint that could not be loaded, else None: its traceback passes through
    torch.load, DCP's loader, safetensors' loading or a function of the script's named for
    checkpoints, or its exception says so in those libraries' words. Only the failing rank's
    own part of the report counts, never the log's tail."""
    head = report.split(_TAIL_MARK, 1)[0]
    lines = head.splitlines()
    first = lines[0] if lines else ""
    error = (
        first.split(": ", 1)[1] if first.startswith(("rank ", "node ")) and ": " in first else None
    )
    if error is None:
        return None
    if _LOAD_ERROR.search(error) or any(_LOAD_FRAME.search(line.strip()) for line in lines):
        return error
    return None
