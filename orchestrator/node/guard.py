"""The guard of a node: the job's limits, enforced on the node itself, whoever else is gone.

Standard library only, Python 3.8 or newer: the `guard` program of the node runtime
(`orchestrator.node.runtime`), put on every node (its part of it by cloud-init on AWS and
sandbox nodes, the whole runtime by the provider's own start on local nodes) and started there
at boot, before any code is synced, with the job's terms in a JSON file:

    python3 orch-node-<version>.pyz guard TERMS_JSON

Terms (all times are UTC epoch seconds, durations are seconds; null: not set):

    job_id, home               where the job's files are: <home>/orch-jobs/<job_id>/
    user                       (without home) the login user whose home that is
    interval_s                 how often the guard looks
    silence_s                  a controller unheard from this long is taken for gone
    allowance_s                how long past a limit a live controller gets to act first
    deadman_s                  no controller for this long and no training: power off
                               (null: never)
    autostop                   a kept cluster's node: the dead-man is its autostop, which
                               also waits for the GPUs to be idle
    made_at                    when the controller made the terms (its clock): the times
                               below are mapped onto this node's clock from the guard's first
                               arming (`guard_limits`)
    runtime_deadline           max_runtime: the run is stopped at this time
    lease_until                the budget lease: the run is stopped at this time unless renewed
    runtime_ceiling, budget_ceiling   the latest runtime deadline and budget lease any lease
                               may set (null: none): a lease never lifts the node past them
    transfer_hold_s            a transfer counts as a live controller at most this long
    idle_timeout_s             GPUs (or, without GPUs, the job's processes) idle this long
    idle_util_pct, idle_cpu_pct   the controller's idle thresholds
    start_timeout_s            a start with no progress this long (`run_progress`)
    stall_timeout_s            a run whose progress stopped this long (`run_progress`)
    progress_pattern           the job's progress.pattern: which lines are its steps
    stop_grace_s               SIGTERM, then this long for the emergency checkpoint, then SIGKILL
    upload_wait_s              then at most this long for the checkpoint agent's uploads
    poweroff                   the node's poweroff command (shell)
    gpu_indices                the machine's GPUs this node may use (null: all): only
                               those count for idleness (an allocation on a shared machine)

    lease_key                  base64 of the Ed25519 public key that signs the leases
    metadata_url               the node's instance metadata endpoint (null: none)
    notice_interval_s          how often the spot-notice watch polls it

The guard is the node's daemon: one process whose jobs are periodic events (`events`), each
supervised (an event that raises is logged, counted and run again later; it never ends the
guard): `limits`, the pass over the limits below, every `interval_s`, and `notices`, the
spot-notice watch (`notice_event`), every `notice_interval_s`. `status.json` says which
events run and the failures counted (`events`).

The controller renews `<job>/guard/lease.json` (`"runtime_deadline"`, `"lease_until"`,
`"renewed_at"`, `"job_id"`, on a kept cluster `"idle_timeout_s"` and `"autostop_s"` too); its
values replace the boot terms', but never past the ceilings the node booted with. A lease
counts only when its signature verifies with `lease_key` (`guard_seal`), it names this job and
it is newer than the lease in force; any other is logged and ignored, and the last good one
holds (kept in the guard's own `state/` folder beside its terms). Lease times are on this
node's clock: the controller measures the node's clock against its own and writes them so.
Every probe of the controller touches `<job>/run/heartbeat`; an rsync running on the node as
the job's user (a sync in progress, HOME the job's home) counts as a live controller too,
while it moves data and for at most `transfer_hold_s` (`guard_limits.TransferWatch`).

The job's files are the login user's, and so the job code's: a guard that runs as root opens
them without following any symlink, reads only regular files and never more than a bound, and
writes there only new files it gives to their owner (`guard_files`).

Limits apply from the boot, before any code is synced: a sync or a restore that hangs is
stopped at max_runtime or the budget lease like a run. While the controller is alive its
decisions come first: a limit reached is acted on only once the controller has been silent
for `silence_s`, or `allowance_s` after the limit. A job with no limit trains on until it
ends; then, with no controller for `deadman_s`, the node powers off. At arming the guard
checks its poweroff path (`sudo -n true` when the command uses sudo): a guard that cannot act
says so in `<job>/guard/status.json`, which the controller reports.

On a kept cluster the lease also carries the job's `start_timeout_s`, `stall_timeout_s` and
`progress_pattern`, which `run_progress` holds against the run's progress.
"""

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time

if __package__:
    from orchestrator.node.events import Event, Scheduler
    from orchestrator.node.guard_files import (
        open_dir,
        own_dir,
        read_at,
        read_json,
        read_terms,
        write_at,
    )
    from orchestrator.node.guard_gpu import gpu_indices, gpu_utilizations
    from orchestrator.node.guard_limits import TransferWatch, armed_anchor, in_force
    from orchestrator.node.guard_seal import lease_problem
    from orchestrator.node.node_kit import log, utc
    from orchestrator.node.notice_event import NoticeWatch
    from orchestrator.node.run_progress import RunProgress
else:  # the program on a node: its modules are beside it
    from events import Event, Scheduler
    from guard_files import open_dir, own_dir, read_at, read_json, read_terms, write_at
    from guard_gpu import gpu_indices, gpu_utilizations
    from guard_limits import TransferWatch, armed_anchor, in_force
    from guard_seal import lease_problem
    from node_kit import log, utc
    from notice_event import NoticeWatch
    from run_progress import RunProgress

DECISION = "decision.json"  # what the guard decided, written before it powers the node off
# in the node runtime beside this file (`orchestrator.node.runtime`)
MODULES = (
    "events.py", "guard_files.py", "guard_gpu.py", "guard_limits.py", "guard_seal.py",
    "node_kit.py", "notice_event.py", "run_progress.py",
)  # fmt: skip
NOTICE_INTERVAL_S = 5.0  # the notice watch's period when the terms give none


def session_pids(leader):
    """Pids of the processes in the session `leader` leads (the detached run)."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fields = proc_stat(int(name))
        if fields is not None and fields[3] == str(leader):
            pids.append(int(name))
    return pids


def proc_stat(pid):
    """/proc/<pid>/stat after the command name: [state, ppid, pgrp, session, ...]."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            text = fh.read()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()


def login_home(user):
    """The home directory of the login user `user` (None: unknown), as this node's passwd
    says: a guard started by cloud-init runs as root, the job's files are the user's."""
    if not user:
        return None
    import pwd

    try:
        return pwd.getpwnam(user).pw_dir
    except KeyError:
        return None


def first_program(words):
    """The program a shell command line runs first, past `env` (and its options and
    assignments), `setsid` and `nohup`."""
    i = 0
    while i < len(words):
        word = words[i]
        if word in ("env", "setsid", "nohup", "exec"):
            i += 1
        elif word == "-u":
            i += 2
        elif word.startswith("-") or ("=" in word and not word.startswith("/")):
            i += 1
        else:
            return word
    return None


class Limits(Event):
    """The guard's pass over the job's limits (`Guard.step`), every `interval_s`, failing or
    not: the limits it checks before a failing part still act on time."""

    name = "limits"
    backs_off = False

    def __init__(self, guard):
        self.guard = guard
        self.period_s = guard.terms["interval_s"]

    def run(self, now):
        if self.guard.step(now):
            return 60.0  # the poweroff is under way
        return None


class Guard:
    def __init__(self, terms_path):
        self.terms_path = terms_path
        self.terms = read_terms(terms_path)
        if self.terms is None:
            raise SystemExit(f"guard: no terms in {terms_path}")
        t = self.terms
        home = t.get("home") or login_home(t.get("user")) or os.path.expanduser("~")
        self.home = home
        self.job = ("orch-jobs", t["job_id"])
        self.gpu_indices = gpu_indices(t.get("gpu_indices"))
        try:
            st = os.stat(home)
            self.owner = (st.st_uid, st.st_gid) if os.geteuid() == 0 else None
        except OSError:
            self.owner = None
        self.armed_at = time.time()
        self.idle_since = None
        self.cpu_last = None
        self.problem = None
        self.gpus_busy_at = None  # autostop: when the GPUs were last seen busy
        self.lease_text = None  # lease.json as last looked at
        self.accepted = None  # the newest lease that verified (its fields)
        self.accepted_text = None
        self.lease_heard_at = None  # when it was read (this node's clock)
        self.refused = (None, 0.0)  # the last refused lease's reason, when it was logged
        self.state = self.open_state()
        self.progress = RunProgress(self)
        self.anchor = armed_anchor(self.state, self.armed_at)  # the boot terms' clock
        self.transfers = TransferWatch(home)
        self.scheduler = None  # the daemon's events, once it runs (`run`)
        try:
            os.close(open_dir(home, self.job + ("guard",), make=(0o755, self.owner)))
        except OSError as exc:
            log(f"guard: could not make the job's guard folder: {exc}")

    def open_state(self):
        """The guard's own folder, `state/` beside its terms (AWS: /opt/orch-guard/state, root's,
        0700), out of the job's reach; it keeps the lease in force across restarts. The job's
        guard/ folder only gets copies of what the guard reports. None: none could be made."""
        path = os.path.join(os.path.dirname(os.path.abspath(self.terms_path)), "state")
        try:
            state = own_dir(path)
        except OSError as exc:
            log(f"guard: no state folder {path}: {exc}")
            return None
        kept = read_at(state, "lease.json")
        doc = read_json(kept)
        if doc is not None and not lease_problem(doc, self.terms.get("lease_key"), self.job[1]):
            doc.pop("signature", None)
            self.accepted, self.accepted_text = doc, kept
        return state

    # --- the job's files (the login user's: never through a symlink) -----------------------
    def job_read(self, folder, name):
        try:
            fd = open_dir(self.home, self.job + (folder,))
        except OSError:
            return None
        try:
            return read_at(fd, name)
        finally:
            os.close(fd)

    def job_stat(self, folder, name=None):
        try:
            fd = open_dir(self.home, self.job + (folder,))
        except OSError:
            return None
        try:
            return os.fstat(fd) if name is None else os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError:
            return None
        finally:
            os.close(fd)

    def report(self, name, value):
        """Write `name` in the guard's state directory and a copy in the job's guard/ folder,
        given to the login user (the controller reads it there)."""
        text = json.dumps(value, indent=1, sort_keys=True)
        if self.state is not None:
            write_at(self.state, name, text, mode=0o600)
        fd = open_dir(self.home, self.job + ("guard",), make=(0o755, self.owner))
        try:
            write_at(fd, name, text, owner=self.owner)
        finally:
            os.close(fd)

    # --- what the node says ---------------------------------------------------------------
    def lease(self, now=None):
        """The newest lease the controller signed for this job: `guard/lease.json` when it
        verifies and is newer than the one in force, else the one in force ({}: none yet).
        Whatever else the file holds is logged and ignored."""
        text = self.job_read("guard", "lease.json")
        if text is None or text in (self.lease_text, self.accepted_text):
            return self.accepted or {}
        self.lease_text = text
        doc = read_json(text)
        why = "it is not a JSON object" if doc is None else None
        why = why or lease_problem(doc, self.terms.get("lease_key"), self.terms["job_id"])
        if why is None and self.accepted and doc["renewed_at"] <= self.accepted["renewed_at"]:
            why = "it is not newer than the lease in force (an old lease put back)"
        if why is not None:
            at = time.time()
            if why != self.refused[0] or at - self.refused[1] >= 60:
                log(f"guard: ignored guard/lease.json: {why}; the lease in force holds")
                self.refused = (why, at)
            return self.accepted or {}
        doc.pop("signature", None)
        self.accepted, self.accepted_text = doc, text
        # Heard when written (never later than now: job code may only make it earlier).
        now = time.time() if now is None else now
        written = self.job_stat("guard", "lease.json")
        self.lease_heard_at = now if written is None else min(now, written.st_mtime)
        if self.state is not None:
            with contextlib.suppress(OSError):
                write_at(self.state, "lease.json", text, mode=0o600)
        return doc

    def heard_at(self):
        """When the controller was last heard of: a probe (heartbeat) or a lease renewal."""
        heard = max(self.armed_at, self.lease_heard_at or 0.0)
        beat = self.job_stat("run", "heartbeat")
        return heard if beat is None else max(heard, beat.st_mtime)

    def run_leader(self):
        """The pid of the detached run while it trains; None before it starts or once ended."""
        if self.job_stat("run", "exit_code") is not None:
            return None
        try:
            pid = int((self.job_read("run", "pid") or "").strip())
        except ValueError:
            return None
        fields = proc_stat(pid)
        if fields is None or fields[0] == "Z":
            return None
        return pid

    def job_cpu_seconds(self, leader):
        ticks = 0
        for pid in session_pids(leader):
            fields = proc_stat(pid)
            if fields is not None and len(fields) > 12:
                ticks += int(fields[11]) + int(fields[12])
        return ticks / float(os.sysconf("SC_CLK_TCK"))

    def idle_for(self, now, leader):
        """Seconds the run has been idle by the controller's rules; 0 while busy or unknown."""
        t = self.terms
        if leader is None:
            self.idle_since, self.cpu_last = None, None
            return 0.0
        utils = gpu_utilizations(timeout_s=max(5.0, t["interval_s"]), indices=self.gpu_indices)
        if utils is not None:
            idle = all(u < t["idle_util_pct"] for u in utils)
        else:
            cpu = self.job_cpu_seconds(leader)
            last, self.cpu_last = self.cpu_last, (now, cpu)
            if last is None or now <= last[0]:
                return self._idle_clock(now, None)
            idle = 100.0 * (cpu - last[1]) / (now - last[0]) < t["idle_cpu_pct"]
        return self._idle_clock(now, idle)

    def _idle_clock(self, now, idle):
        if idle is None:
            return 0.0 if self.idle_since is None else now - self.idle_since
        if not idle:
            self.idle_since = None
            return 0.0
        if self.idle_since is None:
            self.idle_since = now
        return now - self.idle_since

    # --- the decision ---------------------------------------------------------------------
    def due(self, now):
        """The first limit reached, as (kind, since, message), or None."""
        t = self.terms
        lease = self.lease(now)
        leader = self.run_leader()
        deadline, until = in_force(lease, t, self.anchor)
        idle_timeout = lease.get("idle_timeout_s", t.get("idle_timeout_s"))
        idle_s = self.idle_for(now, leader) if idle_timeout else 0.0
        if deadline is not None and now >= deadline:
            return "max_runtime", deadline, f"max_runtime reached at {utc(deadline)}"
        if until is not None and now >= until:
            return "budget", until, f"the budget lease ran out at {utc(until)}"
        if idle_timeout and idle_s >= idle_timeout:
            since = now - idle_s + idle_timeout
            what = "GPUs" if self.cpu_last is None else "the job's processes"
            return "idle", since, f"{what} idle for {idle_s:.0f} s"
        found = self.progress_due(now, lease, leader)
        if found is not None:
            return found
        deadman_s = (
            lease.get("autostop_s", t.get("deadman_s"))
            if t.get("autostop")
            else (t.get("deadman_s"))
        )
        if leader is not None or deadman_s is None or self.syncing(now):
            return None
        if t.get("autostop"):
            return self.autostop_due(now, deadman_s)
        silent = now - self.heard_at()
        if silent > deadman_s:
            return "deadman", now, f"no controller for {silent:.0f} s and no training"
        return None

    def progress_due(self, now, lease, leader):
        """A start that made no progress, or a run that stalled (`run_progress`)."""
        t = self.terms
        start_s = lease.get("start_timeout_s", t.get("start_timeout_s"))
        stall_s = lease.get("stall_timeout_s", t.get("stall_timeout_s"))
        pattern = lease.get("progress_pattern", t.get("progress_pattern"))
        return self.progress.due(now, leader, start_s, stall_s, pattern)

    def autostop_due(self, now, autostop_s):
        """A kept cluster with no job: its nodes end once neither a controller nor the GPUs
        (a user's own process, started over `orch ssh`) were busy for `autostop_s`."""
        utils = gpu_utilizations(
            timeout_s=max(5.0, self.terms["interval_s"]), indices=self.gpu_indices
        )
        if utils is not None and any(u >= self.terms["idle_util_pct"] for u in utils):
            self.gpus_busy_at = now
        quiet = now - max(self.heard_at(), self.gpus_busy_at or 0.0)
        if quiet > autostop_s:
            return (
                "autostop",
                now,
                f"no run, no controller and idle GPUs for {quiet:.0f} s (autostop)",
            )
        return None

    def controller_alive(self, now):
        return now - self.heard_at() < self.terms["silence_s"] or self.syncing(now)

    def syncing(self, now):
        """Whether a transfer of the controller's is under way (`guard_limits.TransferWatch`)."""
        t = self.terms
        return self.transfers.active(now, t["silence_s"], t.get("transfer_hold_s"))

    def step(self, now):
        found = self.due(now)
        if found is None:
            return False
        kind, since, message = found
        if kind not in ("deadman", "autostop") and self.controller_alive(now):
            if now < since + self.terms["allowance_s"]:
                return False  # the controller decides first
            message += " and the controller did not act within {:.0f} s".format(
                self.terms["allowance_s"]
            )
        else:
            message += "; no controller heard for %.0f s" % (now - self.heard_at())
        self.act(kind, message)
        return True

    # --- acting ---------------------------------------------------------------------------
    def act(self, kind, message):
        log(f"guard: {kind}: {message}")
        self.status(acting={"kind": kind, "message": message, "at": utc(time.time())})
        leader = self.run_leader()
        if leader is not None:
            self.stop_run(leader)
        self.wait_for_uploads()
        try:  # read by a local node's poweroff, which keeps it with the node's record
            self.report(DECISION, {"kind": kind, "message": message, "at": time.time()})
        except OSError as exc:
            log(f"guard: could not write its decision: {exc}")
        log("guard: powering off")
        subprocess.run(self.terms["poweroff"], shell=True, check=False)

    def stop_run(self, leader):
        log(
            f"guard: SIGTERM to the run (session {leader}), "
            f"{self.terms['stop_grace_s']:.0f} s to checkpoint"
        )
        self.signal_session(leader, signal.SIGTERM)
        deadline = time.time() + self.terms["stop_grace_s"]
        while time.time() < deadline and session_pids(leader):
            time.sleep(0.2)
        if session_pids(leader):
            log("guard: the run outlived its grace: SIGKILL")
            self.signal_session(leader, signal.SIGKILL)

    @staticmethod
    def signal_session(leader, sig):
        for pid in session_pids(leader):
            with contextlib.suppress(OSError):
                os.kill(pid, sig)

    def wait_for_uploads(self):
        """With a checkpoint store: until the node's checkpoint agent, which finishes its
        uploads once the run has ended, says it is done (or is gone)."""
        wait = self.terms.get("upload_wait_s") or 0
        if wait <= 0 or self.job_stat("checkpoint-agent") is None:
            return
        deadline = time.time() + wait
        while time.time() < deadline:
            manifest = read_json(self.job_read("checkpoint-agent", "manifest.json")) or {}
            if manifest.get("done") or not self.agent_running():
                return
            time.sleep(0.5)
        log(f"guard: the checkpoint agent was still uploading after {wait:.0f} s")

    def agent_running(self):
        try:
            fields = proc_stat(int((self.job_read("checkpoint-agent", "pid") or "").strip()))
        except ValueError:
            return False
        return fields is not None and fields[0] != "Z"

    # --- arming -----------------------------------------------------------------------------
    def poweroff_problem(self):
        """Why the poweroff command cannot work here, or None."""
        try:
            program = first_program(shlex.split(self.terms["poweroff"]))
        except ValueError as exc:
            return f"the poweroff command does not parse: {exc}"
        if program is None or shutil.which(program) is None:
            return f"{program!r} is not on this node"
        if os.path.basename(program) == "sudo":
            check = subprocess.run(
                ["sudo", "-n", "true"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                check=False,
            )
            if check.returncode != 0:
                detail = check.stderr.decode("utf-8", "replace").strip()
                return "sudo asks for a password here (%s)" % (detail or "sudo -n true failed")
        return None

    def status(self, **fields):
        value = {
            "armed_at": utc(self.armed_at),
            "pid": os.getpid(),
            "user": os.geteuid(),
            "problem": self.problem,
        }
        if self.scheduler is not None:
            value["events"] = self.scheduler.status()
        value.update(fields)
        try:
            self.report("status.json", value)
        except OSError as exc:
            log(f"guard: could not write its status: {exc}")

    def run(self):
        self.problem = self.poweroff_problem()
        t = self.terms
        log(
            "guard: armed for job {} (max_runtime {}, budget lease {}, idle {}){}".format(
                t["job_id"],
                utc(t["runtime_deadline"]) if t.get("runtime_deadline") else "none",
                utc(t["lease_until"]) if t.get("lease_until") else "none",
                "{:.0f} s".format(t["idle_timeout_s"]) if t.get("idle_timeout_s") else "none",
                f"; CANNOT POWER OFF: {self.problem}" if self.problem else "",
            )
        )
        self.scheduler = Scheduler(self.events(), on_failure=lambda event: self.status())
        self.status()
        self.scheduler.run_forever()

    def events(self):
        """The daemon's events: the limits pass and the spot-notice watch (`notice_event`)."""
        t = self.terms
        interval = t.get("notice_interval_s") or NOTICE_INTERVAL_S
        notices = NoticeWatch(self.home, self.owner, t.get("metadata_url"), interval)
        return [Limits(self), notices]


def main(argv):
    if len(argv) != 2:
        raise SystemExit("usage: guard.py TERMS_JSON")
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    Guard(argv[1]).run()


if __name__ == "__main__":
    main(sys.argv)
