"""How orch arms and feeds the guard of a node: its terms, its lease, how it starts at boot.

Pure: the terms document, the lease arithmetic, command text and the cloud-init part, and the
parser of the guard's status. The guard itself is `orchestrator.node.guard`, the `guard`
program of the node runtime (`orchestrator.node.runtime`). On a node, under the home directory:

    orch-jobs/.node/orch-node-<version>.pyz  the program: the node runtime's `guard`
                                            (AWS: its part in /opt/orch-guard/, root's)
    orch-jobs/<job id>/guard/terms.json      the job's limits as of the launch (see `GuardTerms`)
    .../state/          the guard's own folder, 0700 (AWS: /opt/orch-guard/state/)
    .../lease.json      what the controller renews (`GuardLease`), signed with the job's key
    .../status.json     written by the guard at arming: its pid and any problem it found;
                        again at each failure of one of its events (`events`: their runs
                        and failures)
    orch-jobs/.node/spot-notices             what its spot-notice watch learnt (`spot_notice`)
    .../decision.json   the limit it acted on, written before it powers the node off
    .../guard.log       its output (local nodes; AWS: the journal of `orch-guard.service`)

Lease times are written on each node's own clock: `clock_command` (and each renewal) prints
the node's clock, which the controller reads between sending and receiving (`parse_clock`).

Billing: a node whose guard acts is gone `stop_grace_s` (plus, with a store, the agent's last
uploads) after the limit, plus the provider's poweroff time. A guard never acts earlier than
the controller would have; while the controller is heard from, it acts only `allowance_s`
after a limit.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import shlex
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path

from orchestrator.node import guard, guard_seal, runtime
from orchestrator.node.file_write import write_file_command
from orchestrator.node.launch import NodeLayout, home_expr

AWS_GUARD_DIR = "/opt/orch-guard"  # where cloud-init writes the program and its terms
AWS_UNIT = "orch-guard.service"
ALIVE_MARK = "@@orch-guard-alive"
CLOCK_MARK = "@@orch-clock"  # followed by the node's clock, ns since the epoch
AWS_POWEROFF = "shutdown -h now"  # the guard runs as root there; EC2 terminates on shutdown


@dataclass(frozen=True)
class GuardLayout:
    """Where a job's guard keeps its files on a node (home-relative paths)."""

    job_id: str

    @property
    def root(self) -> str:
        return f"{NodeLayout(self.job_id).root}/guard"

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
    # The public half of the key that signs the leases (OpenSSH `ssh-ed25519 ...`); None: the
    # guard accepts no lease, and the terms' own limits hold.
    lease_key: str | None = None
    start_timeout_s: float | None = None  # recovery.start_timeout (see `run_progress`)
    stall_timeout_s: float | None = None  # budget.stall_timeout
    progress_pattern: str | None = None  # progress.pattern: which lines of rank 0 are steps
    # The latest deadline any lease may set (None: none): max_runtime from the job's start,
    # known once it has started (a first launch's nodes boot before it).
    runtime_ceiling: datetime | None = None
    # USD per hour the job's other nodes bill beside this launch's (the survivors of a partial
    # replacement): the boot budget lease counts them too.
    others_hourly_usd: Decimal = Decimal(0)
    # A transfer (rsync) counts as a live controller at most this long (None: while it moves).
    transfer_hold_s: float | None = None
    notice_interval_s: float = guard.NOTICE_INTERVAL_S  # how often the spot-notice watch polls

    def for_node(
        self,
        *,
        now: datetime,
        hourly_usd: Decimal,
        poweroff: str,
        home: str | None = None,
        user: str | None = None,
        metadata_url: str | None = None,
        gpu_indices: Sequence[int] | None = None,
    ) -> str:
        """The terms document for one node of a launch whose nodes cost `hourly_usd` together.

        `home` is where the job's files are; without it, the home of the login `user` on the
        node, else the guard's own $HOME. `metadata_url`: the node's instance metadata
        endpoint, which the guard's spot-notice watch polls (None: the node has none).
        `gpu_indices`: the machine's GPUs the node may use, the only ones whose use keeps it
        from idling (None: all)."""
        reserve_s = self.stop_grace_s + self.stop_allowance_s
        ends = [
            lease_until(now=now, budget_left_usd=left, hourly_usd=hourly, reserve_s=reserve_s)
            for left, hourly in (
                (self.budget_left_usd, hourly_usd + self.others_hourly_usd),
                *((left, others + hourly_usd) for left, others in self.shared_budgets),
            )
        ]
        until = min((end for end in ends if end is not None), default=None)
        hidden = ("runtime_deadline", "budget_left_usd", "stop_allowance_s", "shared_budgets",
                  "runtime_ceiling", "others_hourly_usd")  # fmt: skip
        doc = {key: value for key, value in asdict(self).items() if key not in hidden}
        # A kept cluster serves one job after another, each with its own limits: no ceiling.
        own_budget = None if self.autostop else ends[0]
        doc.update(
            made_at=now.timestamp(),
            runtime_deadline=epoch(self.runtime_deadline),
            lease_until=epoch(until),
            runtime_ceiling=None if self.autostop else epoch(self.runtime_ceiling),
            budget_ceiling=epoch(own_budget),
            poweroff=poweroff,
            home=home,
            user=user,
            lease_key=raw_public_key(self.lease_key) if self.lease_key else None,
            metadata_url=metadata_url,
            gpu_indices=None if gpu_indices is None else [int(i) for i in gpu_indices],
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


@dataclass(frozen=True)
class GuardLease:
    """What the controller grants the guards at each budget check, on its own clock. With
    `job_limits` (nodes of a kept cluster, which serve one job after another) it carries the
    job's idle, start and stall timeouts, its progress pattern and the cluster's autostop
    too, so that no job's limit outlives it on the node and the latest submit's autostop
    holds."""

    renewed_at: datetime
    runtime_deadline: datetime | None
    lease_until: datetime | None
    idle_timeout_s: float | None = None
    job_limits: bool = False
    autostop_s: float | None = None
    start_timeout_s: float | None = None
    stall_timeout_s: float | None = None
    progress_pattern: str | None = None

    def fields(self, job_id: str, clock_offset_s: float) -> dict[str, object]:
        """The lease as a node whose clock is `clock_offset_s` ahead of the controller's reads
        it: its times on the node's clock."""

        def on_node(when: datetime | None) -> float | None:
            return None if when is None else when.timestamp() + clock_offset_s

        doc: dict[str, object] = {
            "job_id": job_id,
            "renewed_at": on_node(self.renewed_at),
            "runtime_deadline": on_node(self.runtime_deadline),
            "lease_until": on_node(self.lease_until),
        }
        if self.job_limits:
            doc["idle_timeout_s"] = self.idle_timeout_s
            doc["autostop_s"] = self.autostop_s
            doc["start_timeout_s"] = self.start_timeout_s
            doc["stall_timeout_s"] = self.stall_timeout_s
            doc["progress_pattern"] = self.progress_pattern
        return doc

    def for_node(
        self, *, job_id: str, clock_offset_s: float, sign: Callable[[bytes], bytes]
    ) -> str:
        """The `lease.json` of one node: `fields`, and `signature`, what `sign` (the job key's
        Ed25519 signing) makes of them (`guard_seal.canonical`)."""
        doc = self.fields(job_id, clock_offset_s)
        signature = base64.b64encode(sign(guard_seal.canonical(doc))).decode()
        return json.dumps({**doc, "signature": signature}, sort_keys=True) + "\n"


def cleared_lease(now: datetime, autostop_s: float | None) -> GuardLease:
    """The lease of a kept cluster between jobs: no job, so no job's limit; its autostop
    (None: never) runs from `now` (the renewal is the controller last heard from)."""
    return GuardLease(
        renewed_at=now, runtime_deadline=None, lease_until=None, job_limits=True,
        autostop_s=autostop_s,
    )  # fmt: skip


def raw_public_key(openssh: str) -> str:
    """Base64 of the 32 raw bytes of an OpenSSH `ssh-ed25519 AAAA...` public key line (what
    the guard verifies with); ValueError for anything else."""
    fields = openssh.split()
    try:
        blob = base64.b64decode(fields[1], validate=True)
    except (IndexError, binascii.Error) as exc:
        raise ValueError(f"not an OpenSSH public key: {openssh[:40]!r}") from exc
    parts: list[bytes] = []
    while blob and len(parts) < 3:
        size = int.from_bytes(blob[:4], "big")
        parts.append(blob[4 : 4 + size])
        blob = blob[4 + size :]
    if fields[0] != "ssh-ed25519" or len(parts) != 2 or parts[0] != b"ssh-ed25519" or blob:
        raise ValueError(f"not an ssh-ed25519 public key: {openssh[:40]!r}")
    if len(parts[1]) != 32:
        raise ValueError("an ssh-ed25519 public key has 32 bytes")
    return base64.b64encode(parts[1]).decode()


def guard_program() -> dict[str, str]:
    """The guard's part of the node runtime, as cloud-init writes it into `AWS_GUARD_DIR`:
    file name -> text (the runtime's `__main__.py`, `guard.py` and the modules it imports
    from beside it), each without its comments and docstrings (`runtime.sources`): all of it
    travels in an EC2 node's user data, where the whole runtime would not fit. The folder is
    run as the zipapp is (`python3 FOLDER guard TERMS`)."""
    files = runtime.sources()
    return {name: files[name] for name in ("__main__.py", "guard.py", *guard.MODULES)}


def renew_command(layout: GuardLayout) -> str:
    """Write the lease (stdin: `GuardLease.for_node(...)`) atomically, then print the node's
    clock (`parse_clock`)."""
    return f"{write_file_command(layout.lease, '0644')} && {clock_command()}"


def clock_command() -> str:
    """Print the node's clock as `CLOCK_MARK <ns since the epoch>`."""
    return f'echo "{CLOCK_MARK} $(date +%s%N)"'


def parse_clock(output: str, sent_ns: int, received_ns: int) -> float | None:
    """The node's clock minus the controller's, in seconds, from a command's output read
    between `sent_ns` and `received_ns` (the controller's clock): the node's clock is taken to
    have been read half way. None when the output has no clock line."""
    for line in output.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == CLOCK_MARK and parts[1].isascii() and parts[1].isdigit():
            return (int(parts[1]) - (sent_ns + received_ns) // 2) / 1e9
    return None


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
    except (ValueError, RecursionError):  # nesting past the parser's depth
        doc = None
    if not isinstance(doc, dict):
        return GuardStatus(armed=False, problem=None)
    problem = doc.get("problem")
    return GuardStatus(armed=alive, problem=str(problem)[:500] if problem else None)


def local_boot_command(home: str, node_runtime: str, terms: str, path: str) -> str:
    """What a local node runs at boot, in its own namespaces, to start its guard detached:
    the `guard` program of the runtime at `node_runtime` (its zipapp on the node's disk)."""
    log = str(Path(terms).with_name("guard.log"))
    guard_run = runtime.program_command("guard", terms, path=node_runtime)
    return (
        f"cd {shlex.quote(home)} && HOME={shlex.quote(home)} PATH={shlex.quote(path)} "
        f"exec {guard_run} >> {shlex.quote(log)} 2>&1"
    )


def cloud_init_parts(terms_document: str) -> dict[str, list]:
    """The cloud-config entries that arm the guard at boot on an EC2 node: the program and its
    terms in `AWS_GUARD_DIR`, a systemd unit that restarts it (and starts it again after a
    reboot), and its start. Where there is no systemd it is started detached instead."""
    run = runtime.program_command("guard", f"{AWS_GUARD_DIR}/terms.json", path=AWS_GUARD_DIR)
    unit = "\n".join(
        [
            "[Unit]",
            "Description=orch guard: the job's limits, enforced on this node",
            "After=network.target",
            "",
            "[Service]",
            f"ExecStart=/usr/bin/env {run}",
            "Restart=always",
            "RestartSec=5",
            "",
            "[Install]",
            "WantedBy=multi-user.target",
            "",
        ]
    )
    fallback = f"setsid nohup {run} >> {AWS_GUARD_DIR}/guard.log 2>&1 < /dev/null &"
    program = [
        {
            "path": f"{AWS_GUARD_DIR}/{name}",
            "permissions": "0755" if name == "guard.py" else "0644",
            # plain text: the user data is gzipped whole (`providers.aws.ec2_requests.packed`),
            # which
            # compresses the modules together, far better than each on its own
            "content": text,
        }
        for name, text in guard_program().items()
    ]
    return {
        "write_files": [
            *program,
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
