"""A run's progress: what counts as progress and when its absence is a failed start or a
stall (`ProgressClock`, pure: the controller's run watch and the node guard both judge by it),
and the guard's reading of it on a node (`RunProgress`).

Part of the guard program (`orchestrator.node.guard`), in the node runtime beside it: standard
library only, Python 3.8 or newer.

Progress is rank 0's: the lines of local rank 0 on node 0 (torchrun prefixes them
`[default0]:`; with `launcher: none`, node 0's own lines count as rank 0's).

- A step line (a JSON object with an integer `step` and no `event` but "done", the lines
  `orchestrator.node.progress` reads) is progress when its step differs from the last one.
  With the job's `progress.pattern` (a regular expression with a named group `step`), the
  lines it matches are the step lines instead, their step that group's digits; JSON lines
  are then not.
- For a job that has never printed a step line, any line of rank 0 is progress: a plain-text
  script is judged by its output growing. Once a step line was seen, only steps count.

The launch script's own lines (`[orch] ...`) are never progress. Its setup is not part of the
start: the start's clock is held while `[orch] setup: running` is the last word, and starts
again at `[orch] setup: done` (or `unchanged`, a setup skipped). A start with no progress
within `start_timeout_s` is a failed start; once there was progress, none for
`stall_timeout_s` is a stall.

On a node the guard reads, in the job's run folder, never through a symlink and never more
than a bound: `pid` (a new pid is a new run, the file's time its start), `launch.sh` (the
node's rank, the run's master, whether torchrun starts it) and `node.log` from where it last
read (at most READ_CHUNK bytes a look). Node 0 holds rank 0's lines and judges by the clock.
The other nodes cannot see them, and leave the decision to a controller they hear from. With
none, a start failed there when the run's master (torchrun's rendezvous store) has not
answered a connection within start_timeout of the setup's end; and, with a stall_timeout, a
run whose master answered, then refused FOLLOW_LOOKS looks in a row, is `orphaned`: rank 0's
node ended its run, and this one follows.
"""

import ipaddress
import json
import os
import re
import socket
import stat

if __package__:
    from orchestrator.node.guard_files import open_dir
else:  # the program on a node: its modules are beside it
    from guard_files import open_dir

SETUP_RUNNING = "[orch] setup: running"  # the launch script's lines (`node.launch`)
SETUP_DONE = "[orch] setup: done"
SETUP_ENDED = (SETUP_DONE, "[orch] setup: unchanged")  # unchanged: a setup skipped
LAUNCH_MARK = "[orch]"  # how every line of the launch script itself starts
READ_CHUNK = 256 * 1024  # bytes of new log read in one look at most (older ones are skipped)
FOLLOW_LOOKS = 3  # looks in a row the master must refuse before a node follows rank 0's
ORPHANED = "orphaned"  # the decision of a node that followed rank 0's: no limit of its own

PATTERN_SPAN = 500  # characters of a line a progress pattern is matched against, at most
STEP_DIGITS = re.compile(r"[0-9]{1,18}")  # a step: plain digits, an integer of 64 bits
PATTERN_GROUPS = ("step", "total", "loss")  # the named groups a progress pattern may have

_RANK_PREFIX = re.compile(r"^\[[A-Za-z_]*?(\d+)\]:(.*)$")
_EXPORT = re.compile(r"export ORCH_(NODE_RANK|MASTER_ADDR|MASTER_PORT)=(\S{1,64})$")


def local_rank_line(line):
    """Split a node-log line into (local rank, text); torchrun's own lines give None."""
    match = _RANK_PREFIX.match(line)
    if not match:
        return None, line
    return int(match.group(1)), match.group(2)


def json_object(text):
    """The JSON object a log line holds, or None (cheap reject of non-JSON lines first)."""
    text = text.strip()
    if not text.startswith("{"):
        return None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):  # nesting past the parser's depth
        return None
    return data if isinstance(data, dict) else None


def compile_pattern(text):
    """The job's `progress.pattern` compiled, or None: none given, or one that does not
    compile here (the spec checks it; a node that cannot compile it keeps the JSON rule)."""
    if not text:
        return None
    try:
        pattern = re.compile(text)
    except (re.error, TypeError, ValueError, OverflowError, RecursionError):
        return None
    return pattern if "step" in pattern.groupindex else None


def pattern_fields(text, pattern):
    """The named groups of `pattern`'s first match in `text` (its first PATTERN_SPAN
    characters), with `step` an integer; None when it does not match or `step` is not
    plain digits."""
    match = pattern.search(text[:PATTERN_SPAN])
    if match is None:
        return None
    fields = match.groupdict()
    step = (fields.get("step") or "").strip()
    if not STEP_DIGITS.fullmatch(step):
        return None
    fields["step"] = int(step)
    return fields


def step_of(text, pattern=None):
    """The step a line of rank 0 reports, or None when it is not a progress line: with the
    job's compiled `pattern`, the lines it matches; without, JSON step lines."""
    if pattern is not None:
        fields = pattern_fields(text, pattern)
        return None if fields is None else fields["step"]
    data = json_object(text)
    # Event lines are not progress, except the final `{"event": "done", "step": N}`.
    if data is None or data.get("event", "done") != "done":
        return None
    step = data.get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) else None


class ProgressClock:
    """The progress of one run, as its lines are read (pure).

    `started_at`: when the run started (or, for a run taken over while it trains, when it was
    taken over: `starting` False, its start is past and the stall clock runs from then).
    `steps`: the job printed a step line before (an earlier run): only steps count.
    `pattern`: the job's compiled `progress.pattern` (None: JSON step lines), for `feed`.
    """

    def __init__(self, started_at, steps=False, starting=True, pattern=None):
        self.origin = started_at  # when the start's clock began
        self.steps = steps
        self.pattern = pattern
        self.step = None  # the last step read
        self.progress_at = None if starting else started_at
        self.in_setup = False

    def feed(self, line, at, unprefixed_is_rank0=False):
        """One line of node 0's log, read at `at`."""
        rank, text = local_rank_line(line)
        if rank is None and text.startswith(LAUNCH_MARK):
            self.launch_line(text, at)
        elif rank == 0 or (rank is None and unprefixed_is_rank0):
            self.saw(step_of(text, self.pattern), at)

    def launch_line(self, text, at):
        """A line of the launch script: the setup holds the start's clock."""
        if text.startswith(SETUP_RUNNING):
            self.in_setup = True
        elif text.startswith(SETUP_ENDED):
            self.in_setup = False
            if self.progress_at is None:
                self.origin = at

    def saw(self, step, at):
        """A line of rank 0, read at `at`: `step` when it is a step line, else None."""
        if step is not None:
            self.steps = True
            if step != self.step:
                self.step = step
                self.progress_at = at
        elif not self.steps:
            self.progress_at = at

    def due(self, now, start_timeout_s, stall_timeout_s):
        """("start" | "stall", when the timeout ran out, seconds without progress) once a
        timeout (None: none) has run out at `now`; else None."""
        if self.in_setup:
            return None
        if self.progress_at is None:
            waited = now - self.origin
            if start_timeout_s and waited >= start_timeout_s:
                return "start", self.origin + start_timeout_s, waited
            return None
        quiet = now - self.progress_at
        if stall_timeout_s and quiet >= stall_timeout_s:
            return "stall", self.progress_at + stall_timeout_s, quiet
        return None


def launch_facts(text):
    """(node rank, (master address, port), torchrun runs) from a launch script's text; None
    for what is missing or malformed (job code may have rewritten the file)."""
    found = dict(m.groups() for m in map(_EXPORT.match, (text or "").splitlines()) if m)
    rank, port = found.get("NODE_RANK", ""), found.get("MASTER_PORT", "")
    try:
        master = (str(ipaddress.ip_address(found.get("MASTER_ADDR", ""))), int(port))
    except ValueError:
        master = None
    torchrun = "\ntorchrun " in (text or "")
    rank_ok = rank.isascii() and rank.isdigit()  # `isdigit` alone takes "²", which int refuses
    return (int(rank) if rank_ok else None), master, torchrun


def answers(master):
    """Whether the run's master accepts a TCP connection (torchrun's rendezvous store)."""
    try:
        socket.create_connection(master, timeout=2).close()
    except (OSError, OverflowError):
        return False
    return True


class RunProgress:
    """The guard's watch on the progress of the node's current run (`due`, once a look)."""

    def __init__(self, guard):
        self.guard = guard
        self.run = self.clock = self.offset = None
        self.rest = b""  # the start of a line not ended yet
        self.steps = False  # a step line was read on this node (in any run)
        self.seen = False  # the master answered during this run
        self.missed = 0  # looks in a row it did not since
        self.pattern = (None, None)  # the job's progress.pattern: (text, compiled)

    def due(self, now, leader, start_s, stall_s, pattern=None):
        """(kind, since, message) once the run's start failed ("start"), it stalled
        ("stall"), or its master ended it (ORPHANED); None otherwise, and always while no
        run trains or neither timeout is set. `pattern`: the job's `progress.pattern`."""
        if not (start_s or stall_s):
            return None
        if pattern != self.pattern[0]:
            self.pattern = (pattern, compile_pattern(pattern))
        rank, master, torchrun = launch_facts(self.guard.job_read("run", "launch.sh"))
        pid = self.guard.job_stat("run", "pid")
        run = None if leader is None else (leader, now if pid is None else min(now, pid.st_mtime))
        if run != self.run:
            self.run, self.seen, self.missed = run, False, 0
            self.clock = run and ProgressClock(run[1], steps=self.steps)
        if self.clock:
            self.clock.pattern = self.pattern[1]
        for line in self.new_lines():
            if self.clock and rank == 0:
                self.clock.feed(line, now, unprefixed_is_rank0=not torchrun)
            elif self.clock:
                self.clock.launch_line(line, now)
        if not self.clock:
            return None
        self.steps = self.clock.steps
        if rank == 0:
            found = self.clock.due(now, start_s, stall_s)
            if found and found[0] == "start":
                return found[0], found[1], f"rank 0 made no progress in {found[2]:.0f} s"
            if found:
                last = "output" if self.clock.step is None else f"step ({self.clock.step})"
                return found[0], found[1], f"rank 0's {last} did not advance for {found[2]:.0f} s"
            return None
        if rank is None or master is None or not torchrun or self.clock.in_setup:
            return None
        where = f"{master[0]}:{master[1]}"
        alive = self.guard.controller_alive(now)
        if not (self.seen and alive):  # while a controller lives, one answer is enough
            ok = answers(master)
            self.seen, self.missed = self.seen or ok, 0 if ok else self.missed + 1
        if alive:  # it reads rank 0's lines: it decides for this node
            return None
        waited = now - self.clock.origin
        if not self.seen and start_s and waited >= start_s:
            why = f"the run's master {where} did not answer in {waited:.0f} s"
            return "start", self.clock.origin + start_s, why
        if self.seen and stall_s and self.missed >= FOLLOW_LOOKS:
            return ORPHANED, now, f"the run's master {where} stopped answering"
        return None

    def new_lines(self):
        """The lines node.log gained since the last look (at most READ_CHUNK bytes of it)."""
        try:
            folder = open_dir(self.guard.home, self.guard.job + ("run",))
        except OSError:
            return []
        try:
            fd = os.open("node.log", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder)
        except OSError:
            return []
        finally:
            os.close(folder)
        try:
            info = os.fstat(fd)
            size = info.st_size if stat.S_ISREG(info.st_mode) else 0
            if self.offset is None or not size - READ_CHUNK <= self.offset <= size:
                self.offset, self.rest = max(0, size - READ_CHUNK), b""
            os.lseek(fd, self.offset, os.SEEK_SET)
            data = os.read(fd, size - self.offset)
        except OSError:
            return []
        finally:
            os.close(fd)
        self.offset += len(data)
        lines = (self.rest + data).split(b"\n")
        self.rest = lines.pop()[-READ_CHUNK:]
        return [line.decode("utf-8", "replace") for line in lines]
