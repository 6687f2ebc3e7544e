"""What `orch fleet add`, `orch fleet status` and `orch fleet remove` do, apart from showing it.

`add_fleet` probes every machine of the fleet at once (`remote.host_probe`, the command
`node.host_facts.PROBE_COMMAND`) and records the fleet only if every machine answered with
facts that parse: one failure and nothing is recorded, and `FleetHostsFailed` names each failed
machine with its reason. The host key each machine showed (or the one its known_hosts entry
pinned) is recorded with it, and every later connection accepts only that key.

`fleet_status` gathers what the ledger says of each fleet: its hosts (their GPUs, health, which
slots are free and which job holds the others), its queue and its use over the last
`USAGE_DAYS` days (`FleetBook.usage`: an owned machine costs the same used or idle).
`fleet_document` turns one into the JSON that `--json` prints. `remove_fleet` forgets a fleet
that nothing holds or waits on; the machines themselves are never touched.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from orchestrator.errors import FleetExists, FleetHostsFailed, OrchError, SpecError
from orchestrator.ledger.fleets import (
    Fleet,
    FleetBook,
    FleetClaim,
    FleetHost,
    FleetUsage,
    FleetWaiter,
)
from orchestrator.ledger.store import Ledger
from orchestrator.node.host_facts import (
    PROBE_COMMAND,
    HostFacts,
    HostFactsError,
    gpus_json,
    parse_facts,
)
from orchestrator.remote.host_probe import HostLogin, probe
from orchestrator.spec.fleet_file import FleetFile, Login

PROBE_TIMEOUT_S = 60.0  # per machine, connect and probe (a first torch import can be slow)
MAX_PARALLEL = 32  # machines probed at once
USAGE_DAYS = 7


@dataclass(frozen=True)
class Probe:
    """What one machine answered: its host key and facts, or why it could not be probed."""

    login: Login
    host_key: str | None = None
    facts: HostFacts | None = None
    error: str | None = None


def add_fleet(
    ledger: Ledger,
    request: FleetFile,
    *,
    owner: str,
    now: datetime,
    announce: Callable[[int], None] = lambda _: None,
    progress: Callable[[Probe], None] = lambda _: None,
    timeout: float = PROBE_TIMEOUT_S,
) -> tuple[Fleet, list[FleetHost]]:
    """Probe `request`'s machines and record the fleet; `announce` hears how many machines are
    about to be probed, `progress` each machine's answer as it comes. Raises `FleetExists`
    (name taken, nothing probed), `FleetError` (a machine is in another fleet, nothing
    probed), `SpecError` (the identity or known_hosts file is not there), `FleetHostsFailed`
    (some machine failed; none recorded)."""
    book = FleetBook(ledger)
    if any(fleet.name == request.name for fleet in book.fleets()):
        raise FleetExists(
            f"a fleet named {request.name} exists already; nothing was probed",
            hint=f"pick another name, or `orch fleet remove {request.name}` first",
        )
    _check_file(request.identity, "identity", "--identity")
    if request.known_hosts is not None:
        _check_file(request.known_hosts, "known_hosts file", "--known-hosts")
    logins = request.logins()
    book.refuse_taken(request.name, ((login.address, login.port) for login in logins))
    announce(len(logins))

    def one(login: Login) -> Probe:
        answer = _probe_one(request, login, timeout)
        progress(answer)
        return answer

    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(logins))) as pool:
        answers = list(pool.map(one, logins))
    failed = [a for a in answers if a.error is not None]
    if failed:
        lines = "\n".join(f"  {a.login}: {a.error}" for a in failed)
        raise FleetHostsFailed(
            f"{len(failed)} of {len(answers)} machine(s) of fleet {request.name} could not be "
            f"probed; nothing was recorded:\n{lines}",
            hint="fix what each line says, then run `orch fleet add` again",
        )
    price, unit = request.price
    fleet = Fleet(
        name=request.name,
        identity=str(request.identity),
        known_hosts=str(request.known_hosts) if request.known_hosts else None,
        price_per_hour=str(price),
        price_unit=unit,
        owner=owner,
        created_at=now,
    )
    book.add(fleet, [_host(request, i, a, now) for i, a in enumerate(answers)])
    return book.get(request.name)


def _check_file(path: Path, what: str, flag: str) -> None:
    if not path.is_file():
        raise SpecError(f"the {what} {path} is not a file", hint=f"give its path with {flag}")


def _probe_one(request: FleetFile, login: Login, timeout: float) -> Probe:
    host_login = HostLogin(
        user=login.user,
        address=login.address,
        port=login.port,
        identity=request.identity,
        proxy_jump=request.proxy_jump,
        known_hosts=request.known_hosts,
    )
    try:
        probed = probe(host_login, PROBE_COMMAND, timeout)
        facts = parse_facts(probed.output)
    except OrchError as exc:
        return Probe(login, error=exc.message)
    except HostFactsError as exc:
        return Probe(login, error=f"its answer to the probe is not usable: {exc}")
    return Probe(login, host_key=probed.host_key, facts=facts)


def _host(request: FleetFile, position: int, answer: Probe, now: datetime) -> FleetHost:
    facts, login = answer.facts, answer.login
    assert facts is not None and answer.host_key is not None
    return FleetHost(
        fleet=request.name,
        position=position,
        user=login.user,
        address=login.address,
        port=login.port,
        proxy_jump=request.proxy_jump,
        host_key=answer.host_key,
        gpus=gpus_json(facts.gpus),
        cpus=facts.cpus,
        memory_mib=facts.memory_mib,
        disk_free_gb=facts.disk_free_gb,
        python=facts.python,
        torch=facts.torch,
        healthy=True,
        health_note="",
        checked_at=now,
    )


@dataclass(frozen=True)
class FleetView:
    """One fleet as `orch fleet status` shows it."""

    fleet: Fleet
    hosts: list[FleetHost]
    held: list[FleetClaim]
    queue: list[FleetWaiter]
    usage: FleetUsage


def fleet_status(ledger: Ledger, name: str | None, now: datetime) -> list[FleetView]:
    """Every fleet (or the one named: `FleetNotFound` when there is none of that name)."""
    book = FleetBook(ledger)
    names = [name] if name is not None else [fleet.name for fleet in book.fleets()]
    views = []
    for each in names:
        fleet, hosts = book.get(each)
        usage = book.usage(each, now - timedelta(days=USAGE_DAYS), now)
        views.append(FleetView(fleet, hosts, book.held(fleet=each), book.queue(each), usage))
    return views


def remove_fleet(ledger: Ledger, name: str) -> None:
    """Forget fleet `name`; `FleetBusy` while a job holds or waits for its machines."""
    FleetBook(ledger).remove(name)


def fleet_document(view: FleetView) -> dict[str, Any]:
    """The fleet as JSON: its settings, each host with its slots, the queue and the usage."""
    fleet, usage = view.fleet, view.usage
    return {
        "name": fleet.name,
        "identity": fleet.identity,
        "known_hosts": fleet.known_hosts,
        "price_per_hour": fleet.price_per_hour,
        "price_unit": fleet.price_unit,
        "owner": fleet.owner,
        "created_at": fleet.created_at.isoformat(),
        "hosts": [_host_document(host, view.held) for host in view.hosts],
        "queue": [
            {
                "position": i + 1,
                "job": w.job_id,
                "nodes": w.nodes,
                "slots_per_node": w.slots_per_node,
                "owner": w.owner,
                "since": w.since.isoformat(),
            }
            for i, w in enumerate(view.queue)
        ],
        "usage": {
            "window_days": USAGE_DAYS,
            "host_hours": round(usage.host_hours, 4),
            "held_hours": round(usage.held_hours, 4),
            "idle_hours": round(max(0.0, usage.host_hours - usage.held_hours), 4),
            "slot_hours": round(usage.slot_hours, 4),
            "held_slot_hours": round(usage.held_slot_hours, 4),
            "utilization": round(usage.utilization, 4),
        },
    }


def _host_document(host: FleetHost, held: list[FleetClaim]) -> dict[str, Any]:
    mine = sorted((c for c in held if c.host_id == host.id), key=lambda c: c.slot)
    taken = {c.slot for c in mine}
    return {
        "position": host.position,
        "login": str(Login(host.user, host.address, host.port)),
        "user": host.user,
        "address": host.address,
        "port": host.port,
        "proxy_jump": host.proxy_jump,
        "host_key": host.host_key,
        "gpus": host.gpu_list(),
        "cpus": host.cpus,
        "memory_mib": host.memory_mib,
        "disk_free_gb": host.disk_free_gb,
        "python": host.python,
        "torch": host.torch,
        "healthy": host.healthy,
        "health_note": host.health_note,
        "checked_at": host.checked_at.isoformat(),
        "slots": list(host.slots()),
        "free": [slot for slot in host.slots() if slot not in taken],
        "held": [
            {"slot": c.slot, "job": c.job_id, "rank": c.rank, "instance_id": c.instance_id}
            for c in mine
        ],
    }


def fleet_costs(ledger: Ledger, start: datetime, now: datetime) -> list[dict[str, Any]]:
    """Each fleet's use from `start` (the month's first instant, for `orch cost`) to `now`:
    host-hours it existed, held by jobs and idle, and the share held. An owned machine costs
    the same used or not, so its idle hours are what the bill of its jobs does not show."""
    book = FleetBook(ledger)
    rows = []
    for fleet in book.fleets():
        usage = book.usage(fleet.name, start, now)
        rows.append(
            {
                "name": fleet.name,
                "since": max(start, fleet.created_at).isoformat(),
                "price_per_hour": fleet.price_per_hour,
                "price_unit": fleet.price_unit,
                "host_hours": round(usage.host_hours, 4),
                "held_hours": round(usage.held_hours, 4),
                "idle_hours": round(max(0.0, usage.host_hours - usage.held_hours), 4),
                "utilization": round(usage.utilization, 4),
            }
        )
    return rows
