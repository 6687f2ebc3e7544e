"""The controller-host daemon: `python -m orchestrator.host.daemon --root DIR`, run on the host
by its supervisor (`layout.supervisor_script`), which starts it again if it dies.

Every `tick_s` it asks the host's orch for its jobs (`orch status --json`, which also gives a
new controller to any unfinished job whose controller died) and writes its heartbeat to
`state.json`. Its jobs are those whose record is in the host's ORCH_HOME (`own`); while `up`
hands a dead host's jobs over (`handing_over`) it counts as busy too. Once it has driven no
unfinished job for `autostop_s` it stops: it sets the stop flag (so the supervisor
does not restart it), runs the host's poweroff command when the host was launched by orch
(billing stops when the machine is gone), and exits 0. SIGTERM (from
`orch controller down`) ends it at once with exit 0.

Its settings are in `DIR/daemon.json`, written by `orch controller up`:
`{"autostop_s": 600, "tick_s": 15, "poweroff": null | "command", "version": "0.1.0"}`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from orchestrator.host.autostop import IdleClock, unfinished
from orchestrator.host.layout import HostLayout

HANDOVER_MAX_S = 1800.0  # a hand-over flag older than this is one that died half-way


def _write_json(path: Path, document: dict[str, Any]) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(document) + "\n")
    os.replace(tmp, path)


def _jobs(layout: HostLayout) -> list[dict[str, Any]] | None:
    """The host's jobs as `orch status --json` lists them; None when it could not say."""
    try:
        done = subprocess.run(
            [layout.orch, "status", "--json"],
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
        return list(json.loads(done.stdout)["jobs"]) if done.returncode == 0 else None
    except (OSError, ValueError, KeyError, subprocess.TimeoutExpired):
        return None


def own(job_ids: list[str], home: Path) -> list[str]:
    """Those of `job_ids` this host drives: their record is in its ORCH_HOME (`home`). On a
    team ledger the host's orch lists every machine's jobs; a teammate's unfinished job must
    not keep the host from its autostop."""
    return [job_id for job_id in job_ids if (home / "jobs" / job_id / "job.json").is_file()]


def handing_over(flag: Path, now: float) -> bool:
    """Whether a hand-over of a dead host's jobs is under way (`HostLayout.handover_flag`,
    touched less than `HANDOVER_MAX_S` ago: one that died half-way keeps the host up no
    longer)."""
    try:
        return now - flag.stat().st_mtime < HANDOVER_MAX_S
    except OSError:
        return False


def _log(message: str) -> None:
    sys.stdout.write(f"{datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ} {message}\n")
    sys.stdout.flush()


def run(root: Path) -> int:
    """The daemon's loop (see the module docstring); returns its exit status."""
    layout = HostLayout(str(root))
    config = json.loads((root / "daemon.json").read_text())
    tick_s = float(config.get("tick_s", 15))
    clock = IdleClock(float(config.get("autostop_s", 600)), None)
    started = datetime.now(UTC)
    (root / "daemon.pid").write_text(f"{os.getpid()}\n")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    _log(f"controller-host daemon {config.get('version')} started (pid {os.getpid()})")
    known: list[str] = []
    while True:
        jobs = _jobs(layout)
        now = time.time()
        if jobs is not None:
            known = own(unfinished(jobs), Path(layout.home))
            clock = clock.tick(now, len(known) + handing_over(Path(layout.handover_flag), now))
        remaining = clock.remaining(now)
        stopping = clock.should_stop(now)
        _write_json(
            Path(layout.state),
            {
                "pid": os.getpid(),
                "version": config.get("version"),
                "started_at": started.isoformat(),
                "heartbeat_at": datetime.now(UTC).isoformat(),
                "jobs": known,
                "autostop_s": clock.autostop_s,
                "autostop_remaining_s": remaining,
                "stopping": stopping,
            },
        )
        if stopping:
            _log(f"no job to drive for {clock.autostop_s:g} s: stopping")
            Path(layout.stop_flag).touch()
            if poweroff := config.get("poweroff"):
                _log("powering the host off")
                subprocess.run(["sh", "-c", poweroff], stdin=subprocess.DEVNULL, check=False)
            return 0
        time.sleep(tick_s)


def main() -> None:
    parser = argparse.ArgumentParser(prog="orchestrator.host.daemon")
    parser.add_argument("--root", required=True, type=Path)
    sys.exit(run(parser.parse_args().root))


if __name__ == "__main__":
    main()
