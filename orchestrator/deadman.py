"""The dead-man switch of a node: it ends its own node once the controller is gone for good.

Every probe of the controller touches `<run dir>/heartbeat` on the node. A small stdlib
watchdog, started detached on every node with the run, checks that file: when it is older than
the timeout AND no training runs any more (the run's exit code is recorded, or its process is
gone), it runs the node's poweroff command (`Instance.poweroff_command`: `shutdown -h now` on
EC2, where orch launches instances that terminate on shutdown). Training itself is never cut
short: a run outlives its controller on purpose, and the watchdog waits for it to end.

This is the last line against a forgotten node billing all weekend: controllers are revived
by any orch command, and reconcile ends orphans, but only if somebody runs orch again.
"""

from __future__ import annotations

import shlex

from orchestrator.launch import NodeLayout, home_expr

HEARTBEAT_FILE = "heartbeat"

WATCHDOG = r"""
import os, subprocess, sys, time
run_dir, timeout, poweroff = sys.argv[1], float(sys.argv[2]), sys.argv[3]
started = time.time()

def training():
    if os.path.exists(os.path.join(run_dir, "exit_code")):
        return False
    try:
        with open(os.path.join(run_dir, "pid")) as fh:
            pid = int(fh.read().strip())
        with open("/proc/%d/stat" % pid) as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, ValueError, IndexError):
        return False

while True:
    time.sleep(max(0.5, min(30.0, timeout / 4)))
    try:
        heard = os.stat(os.path.join(run_dir, "heartbeat")).st_mtime
    except OSError:
        heard = started
    silent = time.time() - heard
    if silent > timeout and not training():
        print("%s no controller for %.0f s and no training: powering off" % (
            time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), silent), flush=True)
        subprocess.run(poweroff, shell=True)
        time.sleep(60)
"""


def watchdog_command(layout: NodeLayout, timeout_s: float, poweroff_command: str) -> str:
    """Shell command that starts the watchdog detached on a node (once: a second call while
    one runs does nothing). Its output goes to `<run dir>/watchdog.log`."""
    if timeout_s <= 0:
        raise ValueError(f"the dead-man timeout must be positive, not {timeout_s}")
    run_dir = home_expr(layout.run_dir)
    argv = shlex.join(["python3", "-u", "-c", WATCHDOG, ".", f"{timeout_s:g}", poweroff_command])
    return "\n".join(
        [
            f"mkdir -p {run_dir} && cd {run_dir} || exit 2",
            'if [ -f watchdog.pid ] && kill -0 "$(cat watchdog.pid)" 2>/dev/null; then exit 0; fi',
            "touch heartbeat",
            f"setsid nohup {argv} > watchdog.log 2>&1 < /dev/null &",
            "echo $! > watchdog.pid",
        ]
    )
