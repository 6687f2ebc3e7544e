"""The node daemon's scheduler: periodic events run by one supervised loop.

Part of the node runtime (`orchestrator.node.runtime`): standard library only, Python 3.8 or
newer. The guard (`orchestrator.node.guard`) is the node's daemon: one process, started at
boot, whose jobs are events of this scheduler (its `limits` pass, the spot-notice watch of
`notice_event`). An event has a name, a period and a `run(now)`; the loop runs every event
that is due, in the order they fall due (the order they were added breaks ties), then sleeps
until the next one.

Supervision: an event that raises never ends the daemon. Its failure is counted, logged with
its traceback (at most TRACE_CHARS of it; a failure in the same words as the event's last
one is counted without another log), and the event runs again at its next period, later
still while it keeps failing: each failure in a row doubles the wait, up to `max_backoff_s`
(or the event's own period, when that is longer). One run that succeeds ends the backoff. An
event whose lateness costs more than its failures (the guard's limits pass: a max_runtime
enforced a minute late is a minute billed) sets `backs_off = False` and keeps its period.

Not every node program is an event of this daemon. The checkpoint agent stays its own
process, started per job as the job's user: the guard runs as root (it powers the node off),
while the agent opens and copies the files the job's code writes. In one process the agent
would be root, and a symlink planted by job code could make it read any file on the node.
"""

import abc
import time
import traceback

if __package__:
    from orchestrator.node.node_kit import log
else:  # the program on a node: its modules are beside it
    from node_kit import log

TRACE_CHARS = 2000  # of a failure's traceback, logged at most
MAX_BACKOFF_S = 60.0  # the longest wait a failing event is given (unless its period is longer)


class Event(abc.ABC):
    """One periodic job of the daemon. `run(now)` returns None (next run one `period_s` on)
    or the seconds until its next run; an event that sets `finished` is not run again. The
    scheduler keeps its count of runs and failures on it."""

    name = "event"
    period_s = 1.0
    first_s = None  # seconds from the start to its first run (None: one period)
    finished = False
    backs_off = True  # False: a failing event keeps its period (see the module's docstring)
    due = 0.0  # when it runs next (the scheduler's clock)
    runs = failures = streak = 0  # runs, failures, failures in a row
    error = None  # the last failure's words

    @abc.abstractmethod
    def run(self, now):
        """Do the event's job once, at `now` (the scheduler's clock)."""


class Scheduler:
    """Runs events when they fall due, each supervised (see the module's docstring).

    `clock` and `sleep` are the loop's time (tests pass fakes); `on_failure(event)` is called
    after a failure is counted."""

    def __init__(self, events, clock=time.time, sleep=time.sleep, on_failure=None,
                 max_backoff_s=MAX_BACKOFF_S):  # fmt: skip
        self.events = list(events)
        self.clock = clock
        self.sleep = sleep
        self.on_failure = on_failure
        self.max_backoff_s = max_backoff_s
        now = clock()
        for event in self.events:
            event.due = now + (event.period_s if event.first_s is None else event.first_s)

    def status(self):
        """Per event, by name: its period, runs and failures (what the daemon reports)."""
        return {
            e.name: {"period_s": e.period_s, "runs": e.runs, "failures": e.failures,
                     "failing": e.streak > 0, "last_error": e.error}
            for e in self.events
        }  # fmt: skip

    def run_due(self, now):
        """Run every event due at `now`, in the order they fell due (ties: the order they were
        given in); returns them."""
        due = sorted(
            (e for e in self.events if not e.finished and e.due <= now), key=lambda e: e.due
        )
        for event in due:
            event.runs += 1
            try:
                wait = event.run(now)
                event.streak = 0
            except Exception as exc:
                wait = self.failed(event, exc)
            event.due = self.clock() + (event.period_s if wait is None else wait)
        return due

    def failed(self, event, exc):
        """Count and log the failure; the wait until the event runs again: its period,
        doubled for each failure in a row past the first, never past the longer of
        `max_backoff_s` and the period."""
        event.failures += 1
        event.streak += 1
        words = f"{type(exc).__name__}: {exc}"[:500]
        if words != event.error:
            trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            log(f"{event.name} failed, runs again later: {trace[-TRACE_CHARS:]}")
        event.error = words
        try:
            if self.on_failure is not None:
                self.on_failure(event)
        except Exception as report:  # a report that fails is no reason to stop either
            log(f"{event.name}: its failure could not be reported: {report!r}")
        if not event.backs_off:
            return event.period_s
        cap = max(event.period_s, self.max_backoff_s)
        return min(cap, event.period_s * 2.0 ** min(event.streak - 1, 30))

    def run_forever(self):
        """Run events as they fall due until every event has finished (never, for a daemon
        with an event that never finishes)."""
        while True:
            due = [e.due for e in self.events if not e.finished]
            if not due:
                return
            wait = min(due) - self.clock()
            if wait > 0:
                self.sleep(wait)
            self.run_due(self.clock())
