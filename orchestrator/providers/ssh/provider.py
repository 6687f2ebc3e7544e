"""Provider `ssh`: a job's nodes are allocations on machines the user already has (a fleet,
`orch fleet add`), never machines orch starts or stops.

Lifecycle, as for every provider (`providers.base`):

    plan(request, budget) -> the fleet's price for the job; refused (exit 2) when the job can
                        never fit the fleet, even with every GPU free, or the fleet is unknown
    launch(request)  -> free slots claimed in the ledger, all nodes at once or none (one node
                        per host; a claim is atomic, so two ledgers' users never hold one GPU),
                        then on each host the allocation made and its guard started. Billing
                        starts at the claim. `FleetFull` (a `CapacityError`) when the fleet has
                        no room now: the launcher queues the job, or fails it with --no-wait.
    terminate(ids)   -> each allocation ended on its host (its processes, its key line, its
                        folder; never the machine), then its claim released: billing stops at
                        the time returned. A host that does not answer is marked unhealthy and
                        its claims released all the same (nothing is placed there until it
                        answers again, when its leftovers are ended first).
    list_owned(...)  -> the held claims of the fleets (the fleet's own records), every ledger's
                        that shares this database
    preempted(ids)   -> the allocations whose host stopped answering (marked unhealthy): the
                        job recovers as after a reclaim without notice, on other hosts.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.errors import (
    FleetFull,
    InstancesNotFound,
    OrchError,
    ProviderError,
    SpecError,
)
from orchestrator.ledger.fleets import Fleet, FleetBook, FleetClaim, FleetHost, NodeClaim
from orchestrator.ledger.store import Ledger, ledger_engine
from orchestrator.providers.base import CloudIdentity, Instance, LaunchRequest, NodeEnd
from orchestrator.providers.plan import DryRun, LaunchPlan, placement
from orchestrator.providers.ssh import hosts
from orchestrator.providers.ssh.allocation import (
    is_instance_id,
    new_instance_id,
    node_price,
)
from orchestrator.providers.ssh.placement import HostSlots, fits_ever, place

if TYPE_CHECKING:
    from orchestrator.config import Settings
    from orchestrator.spec.model import Budget

CLAIM_TRIES = 5  # another ledger took the slots between the look and the claim: look again
REVIVE_EVERY_S = 30.0  # an unhealthy host is asked whether it answers again at most this often


class SshProvider:
    """Nodes on a fleet's hosts. Holds its ledger (opened on first use); no global state."""

    name = "ssh"

    def __init__(self, settings: Settings, ledger: Ledger | None = None) -> None:
        self.settings = settings
        self._ledger = ledger

    # --- the ledger's fleets ------------------------------------------------------------

    def _book(self) -> FleetBook:
        if self._ledger is None:
            self._ledger = Ledger(ledger_engine(self.settings))
        return FleetBook(self._ledger)

    def _fleet(self, request: LaunchRequest) -> tuple[Fleet, list[FleetHost]]:
        if request.fleet is None:
            raise SpecError(
                "provider ssh needs a fleet", hint="add `fleet: NAME` to the spec, or --fleet"
            )
        return self._book().get(request.fleet)

    def _login(self, fleet: Fleet, host: FleetHost) -> hosts.FleetLogin:
        return hosts.FleetLogin(
            label=f"fleet {fleet.name} host {host.position} "
            f"({host.user}@{host.address}:{host.port})",
            user=host.user,
            address=host.address,
            port=host.port,
            host_key=host.host_key,
            identity=Path(fleet.identity).expanduser(),
            state_dir=self.settings.home / "fleets" / fleet.name,
            proxy_jump=host.proxy_jump,
        )

    # --- the provider interface ---------------------------------------------------------

    def plan(self, request: LaunchRequest, budget: Budget) -> DryRun:
        """The fleet's price for the job's nodes (the dearest hosts it may get); refuses a job
        the fleet can never hold (`SpecError`, exit 2) and says whether it would queue now."""
        fleet, fleet_hosts = self._fleet(request)
        slots = self._book().host_slots(fleet.name)
        never = fits_ever(
            slots, request.count, request.gpus_per_node, request.accelerator, fleet=fleet.name
        )
        if never is not None:
            raise SpecError(never, hint="ask for fewer nodes or GPUs, or add hosts to the fleet")
        by_id = {h.id: h for h in fleet_hosts}
        prices = sorted(
            (self._price(fleet, by_id[s.host_id], request.gpus_per_node) for s in slots),
            reverse=True,
        )
        per_node = prices[0] if prices else Decimal(0)
        now = place(
            slots,
            ranks=list(range(request.count)),
            slots_per_node=request.gpus_per_node,
            accelerator=request.accelerator,
        )
        queue = self._book().queue(fleet.name)
        room = (
            "room now: the job starts at once"
            if now is not None and not queue
            else f"no room now: the job queues ({len(queue)} job(s) waiting)"
        )
        plan = LaunchPlan(
            provider=self.name,
            nodes=request.count,
            gpus_per_node=request.gpus_per_node,
            market="on-demand",
            instance_type=f"fleet {fleet.name}",
            price_per_node_hour=per_node,
            max_runtime_s=budget.max_runtime,
            max_cost_usd=budget.max_cost_usd,
            notes=(room, f"price: ${fleet.price_per_hour} per {fleet.price_unit}-hour"),
        )
        document = {
            "provider": self.name,
            "plan": plan.as_dict(),
            "placement": placement(request),
            "fleet": fleet.name,
            "fits_now": now is not None,
            "queued_ahead": len(queue),
        }
        return DryRun(plan, document)

    def _price(self, fleet: Fleet, host: FleetHost, slots: int) -> Decimal:
        total = len(host.slots())
        return node_price(Decimal(fleet.price_per_hour), fleet.price_unit, slots, total)

    def launch(self, request: LaunchRequest) -> list[Instance]:
        """Claim the job's slots and make its allocations (see the module). On any failure
        every allocation made is ended and every claim released before the error."""
        fleet, fleet_hosts = self._fleet(request)
        book = self._book()
        by_id = {h.id: h for h in fleet_hosts}
        claims = self._claim(book, fleet, request)
        try:
            return self._make(fleet, by_id, request, claims)
        except BaseException:
            self._end_claims(book, fleet, by_id, claims)
            raise

    def _claim(self, book: FleetBook, fleet: Fleet, request: LaunchRequest) -> list[FleetClaim]:
        owner = self.settings.owner_label
        held = {c.host_id for c in book.held(job_id=request.job_id)}
        for _ in range(CLAIM_TRIES):
            slots = book.host_slots(fleet.name)
            chosen = place(
                slots,
                ranks=request.node_ranks,
                slots_per_node=request.gpus_per_node,
                avoid=frozenset(held),
                accelerator=request.accelerator,
            )
            if chosen is None and self._revive(book, fleet, slots):
                continue
            if chosen is None:
                raise FleetFull(fleet.name, _full_message(fleet.name, slots, request))
            nodes = [NodeClaim(p.rank, p.host_id, p.slots, new_instance_id()) for p in chosen]
            claimed = book.claim(fleet.name, request.job_id, owner, nodes, datetime.now(UTC))
            if claimed is not None:
                return claimed
        raise FleetFull(
            fleet.name,
            f"fleet {fleet.name}: its free GPUs were taken by others {CLAIM_TRIES} times in a row",
        )

    def _revive(self, book: FleetBook, fleet: Fleet, slots: list[HostSlots]) -> bool:
        """Unhealthy hosts that answer again: their leftover allocations ended, then healthy.
        True when one came back."""
        _, fleet_hosts = book.get(fleet.name)
        by_id = {h.id: h for h in fleet_hosts}
        back = False
        for host_slots in slots:
            if host_slots.healthy:
                continue
            host = by_id[host_slots.host_id]
            now = datetime.now(UTC)
            if (now - host.checked_at.replace(tzinfo=UTC)).total_seconds() < REVIVE_EVERY_S:
                continue  # asked lately: a queued job's polls do not wait on a dead host each
            login = self._login(fleet, host)
            if not hosts.answers(login):
                book.mark_health(host.id, False, host.health_note, now)
                continue
            try:
                held = {c.instance_id for c in book.held(fleet=fleet.name) if c.host_id == host.id}
                hosts.sweep(login, keep=held)
            except OrchError as exc:
                book.mark_health(
                    host.id, False, f"answers, but its leftovers stay: {exc}", datetime.now(UTC)
                )
                continue
            book.mark_health(host.id, True, "", datetime.now(UTC))
            back = True
        return back

    def _make(
        self,
        fleet: Fleet,
        by_id: dict[int, FleetHost],
        request: LaunchRequest,
        claims: list[FleetClaim],
    ) -> list[Instance]:
        nodes = _by_node(claims)
        prices = {
            iid: self._price(fleet, by_id[cs[0].host_id], len(cs)) for iid, cs in nodes.items()
        }
        hourly = sum(prices.values(), Decimal(0))
        now = datetime.now(UTC)
        guard = request.guard

        def one(instance_id: str) -> Instance:
            node_claims = nodes[instance_id]
            host = by_id[node_claims[0].host_id]
            login = self._login(fleet, host)
            gpus = host.gpu_list()
            slots = tuple(sorted(c.slot for c in node_claims))
            terms_for = (
                None
                if guard is None
                else lambda home, ending: guard.for_node(
                    now=now,
                    hourly_usd=hourly,
                    poweroff=ending,
                    home=home,
                    metadata_url=None,
                    gpu_indices=list(slots) if gpus else None,
                )
            )
            try:
                made = hosts.prepare(login, instance_id, request.public_key, terms_for)
            except OrchError as exc:
                self._book().mark_health(
                    host.id, False, f"allocation failed: {exc.message}", datetime.now(UTC)
                )
                raise ProviderError(
                    f"fleet {fleet.name}: could not make the allocation on host "
                    f"{host.position} ({host.user}@{host.address}:{host.port}): {exc.message}",
                    hint="check the host (`orch fleet status "
                    f"{fleet.name}`); the job's other hosts were released",
                ) from exc
            return Instance(
                instance_id=instance_id,
                job_id=request.job_id,
                cluster=request.cluster,
                rank=node_claims[0].rank,
                private_ip=host.address,
                ssh_host=host.address,
                ssh_port=host.port,
                ssh_user=host.user,
                host_key=host.host_key,
                interface=made.interface,
                market="on-demand",
                instance_type=f"{fleet.name}/{host.position}",
                price_per_hour=prices[instance_id],
                launched_at=min(c.claimed_at for c in node_claims).replace(tzinfo=UTC),
                tags={
                    "orch-job": request.job_id,
                    "orch-cluster": request.cluster,
                    "orch-fleet": fleet.name,
                    "orch-host": str(host.id),
                },
                poweroff_command="",
                metadata_url=None,
                ledger_id=request.ledger_id,
                home=made.home,
                gpu_indices=slots if gpus else None,
                proxy_jump=host.proxy_jump,
            )

        with ThreadPoolExecutor(max_workers=max(1, min(16, len(nodes)))) as pool:
            futures = [pool.submit(one, iid) for iid in nodes]
            made: list[Instance] = []
            errors: list[BaseException] = []
            for future in futures:
                try:
                    made.append(future.result())
                except BaseException as exc:  # noqa: BLE001 - raised below, all finished
                    errors.append(exc)
        if errors:
            raise errors[0]
        book = self._book()
        for instance in made:
            book.describe(instance.instance_id, instance_json(instance))
        return sorted(made, key=lambda i: i.rank)

    def terminate(self, instance_ids: list[str]) -> datetime:
        """End each allocation on its host, then release its claims (see the module)."""
        book = self._book()
        claims = [c for c in book.held() if c.instance_id in set(instance_ids)]
        by_fleet: dict[str, list[FleetClaim]] = {}
        fleets = {f.name: f for f in book.fleets()}
        hosts_by_id: dict[int, tuple[Fleet, FleetHost]] = {}
        for name, fleet in fleets.items():
            for host in book.get(name)[1]:
                hosts_by_id[host.id] = (fleet, host)
        for claim in claims:
            fleet, _ = hosts_by_id[claim.host_id]
            by_fleet.setdefault(fleet.name, []).append(claim)
        for name, fleet_claims in by_fleet.items():
            fleet = fleets[name]
            self._end_claims(
                book,
                fleet,
                {h.id: h for _, h in hosts_by_id.values() if h.fleet == name},
                fleet_claims,
            )
        known = {c.instance_id for c in book.claims_of(instance_ids)}
        unknown = [i for i in instance_ids if i not in known]
        ended = datetime.now(UTC)
        if unknown:
            raise InstancesNotFound(
                f"no fleet allocation has the id(s) {', '.join(unknown)}",
                instance_ids=tuple(unknown),
                ended_at=ended,
                hint="they belong to another ledger's fleets, or never existed",
            )
        return ended

    def _end_claims(
        self, book: FleetBook, fleet: Fleet, by_id: dict[int, FleetHost], claims: list[FleetClaim]
    ) -> None:
        """End the allocations of `claims` on their hosts (at once), then release them; a host
        that does not answer is marked unhealthy."""
        nodes = _by_node(claims)

        def one(instance_id: str) -> None:
            host = by_id[nodes[instance_id][0].host_id]
            try:
                hosts.end(self._login(fleet, host), instance_id)
            except OrchError as exc:
                book.mark_health(
                    host.id,
                    False,
                    f"did not answer while {instance_id} ended: {exc.message}",
                    datetime.now(UTC),
                )

        with ThreadPoolExecutor(max_workers=max(1, min(16, len(nodes)))) as pool:
            list(pool.map(one, nodes))
        book.release(list(nodes), datetime.now(UTC))

    def list_owned(self, *, job_id: str | None = None) -> list[Instance]:
        """The allocations whose claims are held (of one job, when given), as launched."""
        book = self._book()
        found = []
        seen: set[str] = set()
        for claim in book.held(job_id=job_id):
            if claim.instance_id in seen or not claim.detail:
                continue  # one claim per slot; "" while the allocation is being made
            seen.add(claim.instance_id)
            instance = instance_from_json(claim.detail)
            if instance is not None:
                found.append(instance)
        return sorted(found, key=lambda i: (i.job_id, i.rank))

    def identity(self) -> CloudIdentity:
        """The fleets of this ledger: two ORCH_HOMEs on one shared ledger act as the same."""
        ledger = self._ledger or Ledger(ledger_engine(self.settings))
        self._ledger = ledger
        return CloudIdentity(provider=self.name, account=f"ledger:{ledger.ledger_id}")

    def preempted(self, instance_ids: list[str]) -> set[str]:
        """The allocations whose host does not answer now (marked unhealthy)."""
        book = self._book()
        fleets = {f.name: f for f in book.fleets()}
        lost: set[str] = set()
        wanted = set(instance_ids)
        for name, fleet in fleets.items():
            _, fleet_hosts = book.get(name)
            by_id = {h.id: h for h in fleet_hosts}
            held: dict[int, set[str]] = {}  # host -> the wanted allocations on it
            for claim in book.held(fleet=name):
                if claim.instance_id in wanted and claim.host_id in by_id:
                    held.setdefault(claim.host_id, set()).add(claim.instance_id)
            for host_id, allocations in held.items():  # each host asked once, not per slot
                host = by_id[host_id]
                if not hosts.answers(self._login(fleet, host)):
                    book.mark_health(host.id, False, "stopped answering", datetime.now(UTC))
                    lost |= allocations
        return lost

    def self_ended(self, instance_ids: list[str]) -> dict[str, NodeEnd]:
        """An allocation whose guard ended it is gone from its host while its claim is held;
        the guard's reason goes with its folder, so only the fact is known."""
        return {}


def _by_node(claims: list[FleetClaim]) -> dict[str, list[FleetClaim]]:
    nodes: dict[str, list[FleetClaim]] = {}
    for claim in claims:
        nodes.setdefault(claim.instance_id, []).append(claim)
    return nodes


def _full_message(fleet: str, slots: list[HostSlots], request: LaunchRequest) -> str:
    free = ", ".join(f"{len(s.free)}/{len(s.slots)}" for s in slots)
    unhealthy = sum(1 for s in slots if not s.healthy)
    extra = f"; {unhealthy} host(s) unhealthy" if unhealthy else ""
    return (
        f"fleet {fleet} has no room now for {request.count} node(s) x "
        f"{request.gpus_per_node} (free per host: {free}{extra})"
    )


def instance_json(instance: Instance) -> str:
    """The instance as JSON, for its claim's record (`instance_from_json` reads it back)."""
    doc = asdict(instance)
    doc["price_per_hour"] = str(instance.price_per_hour)
    doc["launched_at"] = instance.launched_at.isoformat()
    doc["gpu_indices"] = None if instance.gpu_indices is None else list(instance.gpu_indices)
    doc.pop("container_runtime", None)
    return json.dumps(doc, sort_keys=True)


def instance_from_json(text: str) -> Instance | None:
    """The instance `instance_json` wrote; None for anything else."""
    try:
        doc = json.loads(text)
        doc["price_per_hour"] = Decimal(doc["price_per_hour"])
        doc["launched_at"] = datetime.fromisoformat(doc["launched_at"])
        if doc.get("gpu_indices") is not None:
            doc["gpu_indices"] = tuple(int(i) for i in doc["gpu_indices"])
        instance = Instance(**doc)
    except (ValueError, TypeError, KeyError):
        return None
    return instance if is_instance_id(instance.instance_id) else None
