"""The guard of a node: the job's limits, enforced on the node itself, whoever else is gone.

Standard library only, Python 3.8 or newer: this file is copied to every node (cloud-init on
AWS, the provider's own start on local and sandbox nodes) and started there at boot, before
any code is synced, with the job's terms in a JSON file:

    python3 guard.py TERMS_JSON

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
    runtime_deadline           max_runtime: the run is stopped at this time
    lease_until                the budget lease: the run is stopped at this time unless renewed
    idle_timeout_s             GPUs (or, without GPUs, the job's processes) idle this long
    idle_util_pct, idle_cpu_pct   the controller's idle thresholds
    stop_grace_s               SIGTERM, then this long for the emergency checkpoint, then SIGKILL
    upload_wait_s              then at most this long for the checkpoint agent's uploads
    poweroff                   the node's poweroff command (shell)

The controller renews `<job>/guard/lease.json` (`{"runtime_deadline": .., "lease_until": ..}`
and `"renewed_at"`, on a kept cluster `"idle_timeout_s"` too); its values replace the boot
terms'. Every probe of the controller touches
`<job>/run/heartbeat`; an rsync running on the node as the job's user (a sync in progress,
HOME the job's home) counts as a live controller too.

Limits apply once the run has started (its pid file exists): before, the sync and a checkpoint's
restore hold the controller, and only the dead-man applies. While the controller is alive its
decisions come first: a limit reached is acted on only once
the controller has been silent for `silence_s`, or `allowance_s` after the limit. A job with
no limit trains on until it ends; then, with no controller for `deadman_s`, the node powers
off. At arming the guard checks its poweroff path (`sudo -n true` when the command uses sudo):
a guard that cannot act says so in `<job>/guard/status.json`, which the controller reports.
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

DECISION = "decision.json"  # what the guard decided, written before it powers the node off
NVIDIA_SMI_ARGS = ["--query-gpu=index,utilization.gpu", "--format=csv,noheader,nounits"]


def utc(epoch):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def log(message):
    print(f"{utc(time.time())} {message}", flush=True)


def read_json(path):
    try:
        with open(path) as fh:
            value = json.load(fh)
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def write_json(path, value, owner=None):
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(value, fh, indent=1, sort_keys=True)
    if owner is not None:
        chown(tmp, owner)
    os.replace(tmp, path)


def chown(path, owner):
    with contextlib.suppress(OSError):
        os.chown(path, owner[0], owner[1])


def make_dirs(path, owner):
    """mkdir -p, giving every directory made to `owner` (a root guard must not leave the
    login user a job directory it cannot write)."""
    missing = []
    while path and not os.path.isdir(path):
        missing.append(path)
        path = os.path.dirname(path)
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory)
        if owner is not None:
            chown(directory, owner)


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


def sync_running(home):
    """Whether an rsync writes to this node's `home`: a sync in progress. Only an rsync whose
    HOME is `home` counts (where several nodes share one machine, another node's sync is not
    this one's); one whose environment cannot be read counts too, as a sync may."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/comm") as fh:
                if fh.read().strip() != "rsync":
                    continue
        except OSError:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                env = fh.read().split(b"\0")
        except ProcessLookupError:
            continue  # ended, or a zombie: not a sync
        except OSError:
            return True
        homes = [os.path.normpath(os.fsdecode(v[5:])) for v in env if v.startswith(b"HOME=")]
        if os.path.normpath(home) in homes:
            return True
    return False


def gpu_utilizations(timeout_s):
    """Utilization of every GPU by nvidia-smi; None when there is no usable reading."""
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
        try:
            values.append(float(parts[1]))
        except ValueError:
            return None  # "[N/A]": unknown, never idle
    return values or None


class Guard:
    def __init__(self, terms_path):
        self.terms_path = terms_path
        self.terms = read_json(terms_path)
        if self.terms is None:
            raise SystemExit(f"guard: no terms in {terms_path}")
        t = self.terms
        home = t.get("home") or login_home(t.get("user")) or os.path.expanduser("~")
        self.home = home
        root = os.path.join(home, "orch-jobs", t["job_id"])
        self.run_dir = os.path.join(root, "run")
        self.dir = os.path.join(root, "guard")
        self.agent_dir = os.path.join(root, "checkpoint-agent")
        try:
            st = os.stat(home)
            self.owner = (st.st_uid, st.st_gid) if os.geteuid() == 0 else None
        except OSError:
            self.owner = None
        make_dirs(self.dir, self.owner)
        self.armed_at = time.time()
        self.idle_since = None
        self.cpu_last = None
        self.problem = None
        self.gpus_busy_at = None  # autostop: when the GPUs were last seen busy

    # --- what the node says ---------------------------------------------------------------
    def lease(self):
        return read_json(os.path.join(self.dir, "lease.json")) or {}

    def heard_at(self):
        """When the controller was last heard of: a probe (heartbeat) or a lease renewal."""
        heard = self.armed_at
        for path in (os.path.join(self.run_dir, "heartbeat"), os.path.join(self.dir, "lease.json")):
            with contextlib.suppress(OSError):
                heard = max(heard, os.stat(path).st_mtime)
        return heard

    def run_leader(self):
        """The pid of the detached run while it trains; None before it starts or once ended."""
        if os.path.exists(os.path.join(self.run_dir, "exit_code")):
            return None
        try:
            with open(os.path.join(self.run_dir, "pid")) as fh:
                pid = int(fh.read().strip())
        except (OSError, ValueError):
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
        utils = gpu_utilizations(timeout_s=max(5.0, t["interval_s"]))
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
        lease = self.lease()
        leader = self.run_leader()
        deadline = lease.get("runtime_deadline", t.get("runtime_deadline"))
        until = lease.get("lease_until", t.get("lease_until"))
        idle_timeout = lease.get("idle_timeout_s", t.get("idle_timeout_s"))
        idle_s = self.idle_for(now, leader) if idle_timeout else 0.0
        # Before the run starts (sync, a checkpoint's restore) only the dead-man applies: those
        # steps block the controller, which cannot renew the lease meanwhile.
        started = os.path.exists(os.path.join(self.run_dir, "pid"))
        if not started:
            deadline = until = None
        if deadline is not None and now >= deadline:
            return "max_runtime", deadline, f"max_runtime reached at {utc(deadline)}"
        if until is not None and now >= until:
            return "budget", until, f"the budget lease ran out at {utc(until)}"
        if idle_timeout and idle_s >= idle_timeout:
            since = now - idle_s + idle_timeout
            what = "GPUs" if self.cpu_last is None else "the job's processes"
            return "idle", since, f"{what} idle for {idle_s:.0f} s"
        deadman_s = (
            lease.get("autostop_s", t.get("deadman_s"))
            if t.get("autostop")
            else (t.get("deadman_s"))
        )
        if leader is not None or deadman_s is None or sync_running(self.home):
            return None
        if t.get("autostop"):
            return self.autostop_due(now, deadman_s)
        silent = now - self.heard_at()
        if silent > deadman_s:
            return "deadman", now, f"no controller for {silent:.0f} s and no training"
        return None

    def autostop_due(self, now, autostop_s):
        """A kept cluster with no job: its nodes end once neither a controller nor the GPUs
        (a user's own process, started over `orch ssh`) were busy for `autostop_s`."""
        utils = gpu_utilizations(timeout_s=max(5.0, self.terms["interval_s"]))
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
        return now - self.heard_at() < self.terms["silence_s"] or sync_running(self.home)

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
            write_json(
                os.path.join(self.dir, DECISION),
                {"kind": kind, "message": message, "at": time.time()},
                self.owner,
            )
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
        if wait <= 0 or not os.path.isdir(self.agent_dir):
            return
        deadline = time.time() + wait
        while time.time() < deadline:
            manifest = read_json(os.path.join(self.agent_dir, "manifest.json")) or {}
            if manifest.get("done") or not self.agent_running():
                return
            time.sleep(0.5)
        log(f"guard: the checkpoint agent was still uploading after {wait:.0f} s")

    def agent_running(self):
        try:
            with open(os.path.join(self.agent_dir, "pid")) as fh:
                fields = proc_stat(int(fh.read().strip()))
        except (OSError, ValueError):
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
        value.update(fields)
        try:
            write_json(os.path.join(self.dir, "status.json"), value, self.owner)
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
        self.status()
        while True:
            time.sleep(t["interval_s"])
            if self.step(time.time()):
                time.sleep(60)  # the poweroff is under way


def main(argv):
    if len(argv) != 2:
        raise SystemExit("usage: guard.py TERMS_JSON")
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    Guard(argv[1]).run()


if __name__ == "__main__":
    main(sys.argv)
