"""How orch arms and feeds the guard of a node: its terms, its lease, how it starts at boot.

Pure: the terms document, the lease arithmetic, command text and the cloud-init part, and the
parser of the guard's status. The guard itself is `orchestrator.node.guard`, sent to a node as
its file's text. On a node, under the home directory:

    orch-jobs/<job id>/guard/guard.py       the program (local nodes; AWS: /opt/orch-guard/)
    .../terms.json      the job's limits as of the launch (see `GuardTerms`)
    .../lease.json      what the controller renews: `runtime_deadline`, `lease_until`
    .../status.json     written by the guard at arming: its pid and any problem it found
    .../decision.json   the limit it acted on, written before it powers the node off
    .../guard.log       its output (local nodes; AWS: the journal of `orch-guard.service`)

Billing: a node whose guard acts is gone `stop_grace_s` (plus, with a store, the agent's last
uploads) after the limit, plus the provider's poweroff time. A guard never acts earlier than
the controller would have; while the controller is heard from, it acts only `allowance_s`
after a limit.
"""

from __future__ import annotations

import base64
import gzip
import json
import math
import shlex
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path

from orchestrator.node import guard
from orchestrator.node.launch import NodeLayout, home_expr, write_file_command

AWS_GUARD_DIR = "/opt/orch-guard"  # where cloud-init writes the program and its terms
AWS_UNIT = "orch-guard.service"
ALIVE_MARK = "@@orch-guard-alive"
AWS_POWEROFF = "shutdown -h now"  # the guard runs as root there; EC2 terminates on shutdown


@dataclass(frozen=True)
class GuardLayout:
    """Where a job's guard keeps its files on a node (home-relative paths)."""

    job_id: str

    @property
    def root(self) -> str:
        return f"{NodeLayout(self.job_id).root}/guard"

    @property
    def program(self) -> str:
        return f"{self.root}/guard.py"

    @property
    def terms(self) -> str:
        return f"{self.root}/terms.json"

    @property
    def lease(self) -> str:
        return f"{self.root}/lease.json"

    @property
    def status(self) -> str:
        return f"{self.root}/status.json"

    @property
    def decision(self) -> str:
        return f"{self.root}/{guard.DECISION}"


@dataclass(frozen=True)
class GuardTerms:
    """A job's limits as a node's guard enforces them. Built by the controller for a launch;
    the provider completes it (`for_node`) with what only it knows: the node's price, home
    and poweroff command."""

    job_id: str
    interval_s: float  # how often the guard looks (the controller's watch interval)
    silence_s: float  # a controller unheard from this long counts as gone
    allowance_s: float  # a live controller's time to act on a limit before the guard does
    deadman_s: float | None  # no controller this long and no training: power off (None: never)
    stop_grace_s: float  # SIGTERM -> SIGKILL: the emergency checkpoint's time
    upload_wait_s: float  # with a store: the agent's last uploads (0: no store)
    idle_util_pct: float
    idle_cpu_pct: float
    runtime_deadline: datetime | None = None  # max_runtime, as a UTC time
    budget_left_usd: Decimal | None = None  # max_cost_usd minus the spend so far
    idle_timeout_s: float | None = None
    stop_allowance_s: float = 15.0  # what a stop takes beyond the grace (pull, terminate)
    # A kept cluster's node: the dead-man is its autostop (deadman_s of no job, no controller
    # and idle GPUs; the lease carries each job's limits and is cleared between jobs).
    autostop: bool = False
    # Monthly caps over many jobs (team, user): per cap, (USD left of it this month, USD per
    # hour its other open leases bill); the lease ends when the first runs out at that rate
    # plus this launch's nodes.
    shared_budgets: tuple[tuple[Decimal, Decimal], ...] = ()

    def for_node(
        self,
        *,
        now: datetime,
        hourly_usd: Decimal,
        poweroff: str,
        home: str | None = None,
        user: str | None = None,
    ) -> str:
        """The terms document for one node of a launch whose nodes cost `hourly_usd` together.

        `home` is where the job's files are; without it, the home of the login `user` on the
        node, else the guard's own $HOME."""
        reserve_s = self.stop_grace_s + self.stop_allowance_s
        ends = [
            lease_until(now=now, budget_left_usd=left, hourly_usd=hourly, reserve_s=reserve_s)
            for left, hourly in (
                (self.budget_left_usd, hourly_usd),
                *((left, others + hourly_usd) for left, others in self.shared_budgets),
            )
        ]
        until = min((end for end in ends if end is not None), default=None)
        hidden = ("runtime_deadline", "budget_left_usd", "stop_allowance_s", "shared_budgets")
        doc = {key: value for key, value in asdict(self).items() if key not in hidden}
        doc.update(
            runtime_deadline=epoch(self.runtime_deadline),
            lease_until=epoch(until),
            poweroff=poweroff,
            home=home,
            user=user,
        )
        return json.dumps(doc, indent=1, sort_keys=True) + "\n"

    @property
    def limited(self) -> bool:
        """Whether any limit beyond the dead-man switch is set."""
        return bool(
            self.runtime_deadline is not None
            or self.budget_left_usd is not None
            or self.shared_budgets
            or self.idle_timeout_s
        )

    def with_deadline(self, deadline: datetime | None) -> GuardTerms:
        return replace(self, runtime_deadline=deadline)


def epoch(when: datetime | None) -> float | None:
    return None if when is None else when.timestamp()


def lease_until(
    *, now: datetime, budget_left_usd: Decimal | None, hourly_usd: Decimal, reserve_s: float
) -> datetime | None:
    """Until when the nodes may run on what is left of the budget: never past what
    `budget_left_usd` buys at `hourly_usd`, less `reserve_s` for the stop itself.

    None without a budget, or when the nodes cost nothing. A budget already spent gives `now`.
    """
    if budget_left_usd is None or hourly_usd <= 0:
        return None
    seconds = float(budget_left_usd / hourly_usd * 3600) - reserve_s
    return now + timedelta(seconds=max(0.0, math.floor(seconds * 1000) / 1000))


def lease_document(
    *,
    now: datetime,
    runtime_deadline: datetime | None,
    lease_until: datetime | None,
    idle_timeout_s: float | None = None,
    job_limits: bool = False,
    autostop_s: float | None = None,
) -> str:
    """What the controller writes to `lease.json` at each budget check. With `job_limits`
    (nodes of a kept cluster, which serve one job after another) it carries the job's idle
    timeout and the cluster's autostop too, so that no job's limit outlives it on the node
    and the latest submit's autostop holds."""
    doc: dict[str, float | None] = {
        "renewed_at": now.timestamp(),
        "runtime_deadline": epoch(runtime_deadline),
        "lease_until": epoch(lease_until),
    }
    if job_limits:
        doc["idle_timeout_s"] = idle_timeout_s
        doc["autostop_s"] = autostop_s
    return json.dumps(doc, sort_keys=True) + "\n"


def cleared_lease(now: datetime, autostop_s: float | None) -> str:
    """The lease of a kept cluster between jobs: no job, so no job's limit; its autostop
    (None: never) runs from `now` (the renewal is the controller last heard from)."""
    return lease_document(
        now=now, runtime_deadline=None, lease_until=None, idle_timeout_s=None,
        job_limits=True, autostop_s=autostop_s,
    )  # fmt: skip


def guard_source() -> str:
    """The guard program, as it is sent to the nodes."""
    return Path(guard.__file__).read_text()


def renew_command(layout: GuardLayout) -> str:
    """Write the lease (stdin: `lease_document(...)`) atomically."""
    return write_file_command(layout.lease, "0644")


def status_command(layout: GuardLayout) -> str:
    """Print the guard's status.json, and whether its pid still runs, for `parse_status`."""
    path = home_expr(layout.status)
    return (
        f'f={path}; if [ -f "$f" ]; then cat "$f"; echo; '
        'pid=$(sed -n \'s/.*"pid": *\\([0-9]*\\).*/\\1/p\' "$f" | head -n 1); '
        f'if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then echo {ALIVE_MARK}; fi; fi; true'
    )


@dataclass(frozen=True)
class GuardStatus:
    """What a node's guard said of itself."""

    armed: bool  # status.json exists and its process runs
    problem: str | None  # why it cannot power the node off (None: it can)


def parse_status(output: str) -> GuardStatus:
    """Read `status_command`'s output; a guard with no status, or whose pid is gone, is not
    armed. Untrusted text: anything that is not the guard's JSON counts as no status."""
    lines = output.splitlines()
    alive = ALIVE_MARK in lines
    try:
        doc = json.loads("\n".join(line for line in lines if line != ALIVE_MARK) or "null")
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        return GuardStatus(armed=False, problem=None)
    problem = doc.get("problem")
    return GuardStatus(armed=alive, problem=str(problem)[:500] if problem else None)


def local_boot_command(home: str, program: str, terms: str, path: str) -> str:
    """What a local node runs at boot, in its own namespaces, to start its guard detached."""
    log = str(Path(terms).with_name("guard.log"))
    return (
        f"cd {shlex.quote(home)} && HOME={shlex.quote(home)} PATH={shlex.quote(path)} "
        f"exec python3 -u {shlex.quote(program)} {shlex.quote(terms)} >> {shlex.quote(log)} 2>&1"
    )


def cloud_init_parts(terms_document: str) -> dict[str, list]:
    """The cloud-config entries that arm the guard at boot on an EC2 node: the program and its
    terms in `AWS_GUARD_DIR`, a systemd unit that restarts it (and starts it again after a
    reboot), and its start. Where there is no systemd it is started detached instead."""
    unit = "\n".join(
        [
            "[Unit]",
            "Description=orch guard: the job's limits, enforced on this node",
            "After=network.target",
            "",
            "[Service]",
            f"ExecStart=/usr/bin/env python3 -u {AWS_GUARD_DIR}/guard.py "
            f"{AWS_GUARD_DIR}/terms.json",
            "Restart=always",
            "RestartSec=5",
            "",
            "[Install]",
            "WantedBy=multi-user.target",
            "",
        ]
    )
    fallback = (
        f"setsid nohup python3 -u {AWS_GUARD_DIR}/guard.py {AWS_GUARD_DIR}/terms.json "
        f">> {AWS_GUARD_DIR}/guard.log 2>&1 < /dev/null &"
    )
    return {
        "write_files": [
            {
                "path": f"{AWS_GUARD_DIR}/guard.py",
                "permissions": "0755",
                "encoding": "gz+b64",  # EC2 takes at most 16 KiB of user data
                "content": base64.b64encode(gzip.compress(guard_source().encode(), 9)).decode(),
            },
            {
                "path": f"{AWS_GUARD_DIR}/terms.json",
                "permissions": "0644",
                "content": terms_document,
            },
            {"path": f"/etc/systemd/system/{AWS_UNIT}", "permissions": "0644", "content": unit},
        ],  # fmt: skip
        "runcmd": [
            [
                "sh",
                "-c",
                f"systemctl daemon-reload && systemctl enable --now {AWS_UNIT} || {fallback}",
            ]
        ],  # fmt: skip
    }
