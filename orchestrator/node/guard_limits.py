"""Which limits a node's guard holds, and when a transfer counts as a live controller.

Part of the guard program (`orchestrator.node.guard`), in the node runtime beside it: standard
library only, Python 3.8 or newer.

Boot terms are written by the controller before the node exists, on the controller's clock, at
`made_at`. The guard maps their times onto its own clock from its first arming (`anchor`, kept
in its state folder so that a restart keeps it): shifted by the node's boot time and by however
far the two clocks differ, so a boot limit is never earlier on the node than the controller
meant, and later by at most the node's boot time.

The terms' ceilings (`runtime_ceiling`, `budget_ceiling`) are the limits the node booted with:
a lease replaces the boot terms' own limits, but never past a ceiling (`in_force`). So a
controller that counts the job's start or spend afresh (one that rebuilt the job, or a stale
one) cannot give the node more than it was launched with.

An rsync that writes to the job's home is the controller's sync, which blocks it from probing
the node, so it counts as a live controller; a transfer that hung (its controller died, its
connection half-open) must not hold off the dead-man for ever. It counts only while it moves
data (its read and write counters changed within the guard's silence) and, with
`transfer_hold_s` in the terms, for at most that long from its start (`TransferWatch`).
"""

import contextlib
import json
import os

if __package__:
    from orchestrator.node.guard_files import read_at, read_json, write_at
else:  # the program on a node: its modules are beside it
    from guard_files import read_at, read_json, write_at

ANCHOR = "anchor.json"  # in the guard's state folder: when it was first armed (its clock)


def number(value):
    """`value` as a float when it is a JSON number (not a bool); None otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def capped(value, ceiling):
    """A limit (an epoch time; None: none) held to `ceiling` (None: no ceiling): the earlier
    of the two, and the ceiling where the limit is unset (a lease cannot drop a limit)."""
    if ceiling is None:
        return value
    return ceiling if value is None else min(value, ceiling)


def booted(terms, key, anchor):
    """The boot terms' time `key` on this node's clock (None: unset): shifted by the time
    between the terms' making (controller's clock) and the guard's first arming (its own)."""
    value = number(terms.get(key))
    if value is None:
        return None
    made = number(terms.get("made_at"))
    return value if made is None else value + (anchor - made)


def in_force(lease, terms, anchor):
    """The runtime deadline and the budget lease's end in force (epoch, this node's clock;
    None: none): the lease's where it names them, else the boot terms'; never past the
    ceilings the node booted with."""
    deadline = (
        number(lease["runtime_deadline"])
        if "runtime_deadline" in lease
        else booted(terms, "runtime_deadline", anchor)
    )
    until = (
        number(lease["lease_until"])
        if "lease_until" in lease
        else booted(terms, "lease_until", anchor)
    )
    return (
        capped(deadline, booted(terms, "runtime_ceiling", anchor)),
        capped(until, booted(terms, "budget_ceiling", anchor)),
    )


def armed_anchor(state_fd, now):
    """When the guard was first armed: kept in its state folder (`state_fd`; None: none, so
    `now`), written there at the first arming."""
    if state_fd is None:
        return now
    kept = number((read_json(read_at(state_fd, ANCHOR)) or {}).get("at"))
    if kept is not None and kept <= now:
        return kept
    with contextlib.suppress(OSError):
        write_at(state_fd, ANCHOR, json.dumps({"at": now}), mode=0o600)
    return now


def rsync_transfers(home):
    """The rsyncs that write to this node's `home` (a sync in progress): {(pid, start ticks):
    bytes read and written so far, None when unreadable}. Only an rsync whose HOME is `home`
    counts (where several nodes share one machine, another node's sync is not this one's); one
    whose environment cannot be read counts too, as a sync may."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/comm") as fh:
                if fh.read().strip() != "rsync":
                    continue
            with open(f"/proc/{entry}/stat") as fh:
                start = int(fh.read().rsplit(")", 1)[1].split()[19])
        except (OSError, ValueError, IndexError):
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                env = fh.read().split(b"\0")
        except ProcessLookupError:
            continue  # ended, or a zombie: not a sync
        except OSError:
            env = None
        if env is not None:
            homes = [os.path.normpath(os.fsdecode(v[5:])) for v in env if v.startswith(b"HOME=")]
            if os.path.normpath(home) not in homes:
                continue
        found[(int(entry), start)] = moved_bytes(int(entry))
    return found


def moved_bytes(pid):
    """What process `pid` has read and written so far (`rchar` + `wchar`); None: unreadable."""
    try:
        with open(f"/proc/{pid}/io") as fh:
            fields = dict(line.split(":", 1) for line in fh.read().splitlines() if ":" in line)
        return int(fields["rchar"]) + int(fields["wchar"])
    except (OSError, ValueError, KeyError):
        return None


def process_age(start_ticks):
    """Seconds since a process started `start_ticks` after the boot; None: unknown."""
    try:
        with open("/proc/uptime") as fh:
            uptime = float(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return uptime - start_ticks / float(os.sysconf("SC_CLK_TCK"))


class TransferWatch:
    """The transfers to a node's home, and which of them still count as a live controller."""

    def __init__(self, home):
        self.home = home
        self.seen = {}  # (pid, start) -> (bytes moved when last changed, when that was)

    def active(self, now, silence_s, hold_s=None):
        """Whether a transfer counts as a live controller at `now`: one that moved data within
        `silence_s` (a transfer is taken to move when first seen, and always when its counters
        cannot be read), and, with `hold_s`, started no longer ago than that."""
        current = rsync_transfers(self.home)
        seen = {}
        for key, moved in current.items():
            last = self.seen.get(key)
            changed = last is None or moved is None or moved != last[0]
            seen[key] = (moved, now) if changed else last
        self.seen = seen
        for (_pid, start), (_moved, changed_at) in seen.items():
            if now - changed_at >= silence_s:
                continue  # a stale transfer: its peer is gone or stuck
            age = process_age(start) if hold_s is not None else None
            if age is not None and age > hold_s:
                continue  # older than any push of the controller's lasts
            return True
        return False
