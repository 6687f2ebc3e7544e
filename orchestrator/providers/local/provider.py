"""The local provider: every node is a real OpenSSH sshd on this machine.

Local nodes behave like machines booted from one image that already holds orch's venv: installed
software is shared (the same paths on every node, the controller's venv first on PATH), while
each node's workspace, its HOME, is a private directory (`ORCH_HOME/local/nodes/<id>/disk`).

Two network modes (`local.network` in the settings, `ORCH_LOCAL_NETWORK`):

- namespace (what `auto` picks as root): each node gets a network namespace `orch-<id>` with its
  own address on a host bridge (`local.bridge`, subnet `local.subnet`), and sshd on port 22 of
  that address. Its disk is bind-mounted on `/run/orch-node` in a mount namespace of its own, so
  every node's HOME is `/run/orch-node` yet holds only that node's files.
- loopback (what `auto` picks otherwise): sshd on 127.0.0.1 with a port of its own, and HOME is
  the node's disk directory itself.

In both modes every SSH session starts in HOME (so relative rsync and sftp paths land there)
and carries `ORCH_LOCAL_NODE=<id>`, which is how `terminate` finds processes that detached.

Billing of a node starts when its sshd is started and stops when `terminate` has ended every
process of the node. A terminated node leaves nothing behind: processes, namespace, veth, record
and disk are all removed (the controller pulls checkpoints before it terminates).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.atomic import write_atomic
from orchestrator.config import Settings
from orchestrator.errors import CapacityError, InstancesNotFound, OrchError, ProviderError
from orchestrator.node import guard, guard_files
from orchestrator.node.container import ContainerRuntime
from orchestrator.providers.base import (
    CloudIdentity,
    Instance,
    LaunchRequest,
    Market,
    MarketPrices,
    NodeEnd,
)
from orchestrator.providers.local import net
from orchestrator.providers.local import spot as local_spot
from orchestrator.providers.local.containers import local_runtime, remove_leftover_cgroups
from orchestrator.providers.local.host import (
    netns_pids,
    pid_runs,
    pids_with_marker,
    sshd_pids_on_port,
    sweep,
)
from orchestrator.providers.local.host_network import HostNetwork
from orchestrator.providers.local.net import poweroff_command
from orchestrator.providers.local.starting import NodeStarter, sshd_binary
from orchestrator.providers.local.state import NodeRecord, NodeStore
from orchestrator.providers.traces import SpotTrace, TraceClock

if TYPE_CHECKING:
    from orchestrator.providers.plan import DryRun
    from orchestrator.spec.model import Budget

DECISION_CHARS = 500  # of each field of a guard's decision a node's disk can hand the ledger


class LocalProvider:
    """Nodes on this machine, one sshd each. See the module docstring for what a node is.

    Lifecycle: `launch` -> nodes reachable over SSH, billing started; `list_owned` -> the nodes
    whose records exist under ORCH_HOME/local (`Settings.local_root`); `terminate` -> every
    process of the nodes ended, their namespaces and disks removed, billing stopped.

    `launch` picks the market; the network mode and each node's address or port are
    `host_network.HostNetwork`'s to give, and starting each node (keys, guard, sshd, the wait
    for its banner) is `starting.NodeStarter`'s job.
    """

    name = "local"

    def __init__(self, settings: Settings, *, ready_timeout: float = 60.0) -> None:
        self.settings = settings
        self.store = NodeStore(settings.local_root)
        self.ready_timeout = ready_timeout
        self._network = HostNetwork(settings, self.store)
        self._starter = NodeStarter(settings, self.store, self._network.free_port)
        self._runtime: ContainerRuntime | None = None  # read from this machine when first asked

    # --- Provider interface ---------------------------------------------------------------------

    def plan(self, request: LaunchRequest, budget: Budget) -> DryRun:
        """One offer per market at `local.price_per_hour` / `local.spot_price`; `spot: auto`
        plans the cheaper (the spot grant, `orch local spot`, is not asked)."""
        from orchestrator.providers.plan import local_dry_run, local_plan

        self._check_container(request, self.network_mode())
        local = self.settings.local
        plan = local_plan(request, budget, local.price_per_hour, local.spot_price)
        return local_dry_run(plan, request)

    def launch(self, request: LaunchRequest) -> list[Instance]:
        """Start `request.count` nodes, ordered by rank, each reachable over SSH.

        Returns once every node's sshd answers with its SSH banner; billing of a node starts at
        its `launched_at` (the time its sshd was started). On any failure every node started so
        far is terminated and a `ProviderError` (a `CapacityError` when the subnet is full or
        the price is above `request.max_price_per_hour`) says why, with the sshd log's tail.
        """
        from orchestrator.providers.local.prerequisites import linux

        if not (host := linux()).ok:
            raise ProviderError(f"cannot start local nodes: {host.detail}", hint=host.fix)
        market = self._market(request)
        self._check_request(request, market)
        mode = self.network_mode()
        self._check_container(request, mode)
        sshd = sshd_binary()
        ids = [net.new_instance_id() for _ in range(request.count)]
        try:
            with self.store.making():  # until every node has its record (see reap_unrecorded)
                records = [
                    self._starter.prepare(iid, request, rank, mode, market, self._price(market))
                    for rank, iid in zip(request.node_ranks, ids, strict=True)
                ]
                self._network.allocate(records)
            for rec in records:
                local_spot.start_metadata_endpoint(rec, self.store.node_dir(rec.instance_id))
            hourly = self._price(market) * len(records)
            for rec in records:
                local_spot.wait_metadata_endpoint(rec, self.store.node_dir(rec.instance_id))
                self._starter.start(rec, sshd, self._starter.arm_guard(rec, request, hourly))
            self._starter.wait_ready(records, sshd, self.ready_timeout)
        except BaseException as exc:
            try:
                self._end(ids)
            except Exception as cleanup:  # keep the launch error; say what is left
                exc.add_note(f"cleaning up the failed launch failed too: {cleanup}")
            if isinstance(exc, OrchError) or not isinstance(exc, Exception):
                raise
            raise ProviderError(f"local launch failed: {exc}") from exc
        return [self._instance(rec) for rec in records]

    def terminate(self, instance_ids: list[str]) -> datetime:
        """End every process of the given nodes, remove them, and return when billing stopped.

        Billing stops at the returned UTC time, taken once no process of any of the nodes is
        left. Then the nodes' namespaces, veths, records and disks are removed, and the bridge
        too when no node uses it any more. Idempotent: ids of nodes this ORCH_HOME already ended
        are skipped silently. Ids it never launched (another ORCH_HOME's nodes, or none at all)
        raise `InstancesNotFound` once the others are ended. Raises `ProviderError` if a
        process of a node survives repeated SIGKILLs.
        """
        ids = list(dict.fromkeys(instance_ids))
        unknown = tuple(
            iid
            for iid in ids
            if not net.is_instance_id(iid)
            or not (self.store.node_dir(iid).exists() or self.store.was_ended(iid))
        )
        stopped = self._end(ids)
        if unknown:
            raise InstancesNotFound(
                f"no local node {', '.join(unknown)} was launched from {self.settings.home}: "
                "not ended, and not counted as ended",
                instance_ids=unknown,
                ended_at=stopped,
                hint="run orch with the ORCH_HOME (and on the host) that launched them",
            )
        return stopped

    def _end(self, instance_ids: list[str]) -> datetime:
        """`terminate` without the check for unknown ids (a failed launch ends ids it may not
        have made yet)."""
        ids = [
            iid
            for iid in dict.fromkeys(instance_ids)
            if net.is_instance_id(iid) and self.store.node_dir(iid).exists()
        ]
        survivors = [iid for iid in ids if not self._kill_node(iid)]
        stopped = datetime.now(UTC)
        for iid in ids:
            if os.geteuid() == 0:
                for argv in net.node_net_teardown_argvs(iid):
                    subprocess.run(argv, capture_output=True, check=False)
            if iid not in survivors:
                self.store.remove(iid)
        if os.geteuid() == 0 and ids:
            remove_leftover_cgroups()  # those of the nodes' containers, once they are gone
        if survivors:
            raise ProviderError(f"local nodes {', '.join(survivors)} still have processes")
        if not self.store.all():
            # Even when the given nodes were all gone: a terminate killed between removing its
            # last node and this line left the bridge for the next terminate to remove.
            self.cleanup_network()
        return stopped

    def list_owned(self, *, job_id: str | None = None) -> list[Instance]:
        """Nodes not yet terminated nor reclaimed, from their node.json records only.

        Nodes still being launched are included (their record is written before their sshd
        starts), so a controller restarted after a crash mid-launch can find and end them.
        Directories such a crash left before a node had its record are removed first (nothing
        ever ran in them; see `NodeStore.reap_unrecorded`). The full listing (no `job_id`:
        reconcile, down) also settles the host network (`cleanup_network`).
        """
        self.store.reap_unrecorded()
        if job_id is None:  # reconcile and down: also what a crash left of the host network
            self.cleanup_network()
        return [
            self._instance(rec)
            for rec in self.store.all()
            if (job_id is None or rec.job_id == job_id) and rec.reclaimed_at is None
        ]

    def identity(self) -> CloudIdentity:
        """This host and ORCH_HOME (or `local.root` when set): local nodes live under
        ORCH_HOME/local (or that root) on this host, and only an orch using both can see
        them. No I/O."""
        where = self.settings.local.root or self.settings.home
        return CloudIdentity(provider=self.name, account=f"{os.uname().nodename}:{where}")

    def preempted(self, instance_ids: list[str]) -> set[str]:
        """Those of the given nodes that a reclaim (`orch local preempt`) took."""
        return {
            iid
            for iid in instance_ids
            if (rec := self.store.load(iid)) is not None and rec.reclaimed_at is not None
        }

    def self_ended(self, instance_ids: list[str]) -> dict[str, NodeEnd]:
        """Nodes that powered themselves off (`local.poweroff`), from their kept records."""
        ended: dict[str, NodeEnd] = {}
        for iid in instance_ids:
            if not net.is_instance_id(iid):
                continue
            try:
                doc = json.loads((self._powered_off_dir / f"{iid}.json").read_text())
                ended[iid] = NodeEnd(
                    at=datetime.fromisoformat(doc["at"]),
                    kind=str(doc.get("kind") or ""),
                    message=str(doc.get("message") or "the node powered itself off"),
                )
            except (OSError, ValueError, KeyError, TypeError):
                continue
        return ended

    def guard_decision(self, instance_id: str) -> dict[str, str]:
        """What the node's guard wrote before it asked for the poweroff ({} if nothing).

        The node's disk is its job's to write: the file is read without following a link
        (`guard_files`), up to a bound, and its two fields are cut to `DECISION_CHARS`."""
        disk = self.store.node_dir(instance_id) / "disk"
        try:
            jobs = sorted(e.name for e in os.scandir(disk / "orch-jobs") if not e.is_symlink())
        except OSError:
            return {}
        for job in jobs:
            try:
                folder = guard_files.open_dir(str(disk), ("orch-jobs", job, "guard"))
            except OSError:
                continue
            try:
                doc = guard_files.read_json(guard_files.read_at(folder, guard.DECISION) or "")
            finally:
                os.close(folder)
            if isinstance(doc, dict):
                kind, message = doc.get("kind", ""), doc.get("message", "")
                return {"kind": str(kind)[:DECISION_CHARS],
                        "message": str(message)[:DECISION_CHARS]}  # fmt: skip
        return {}

    def record_self_end(self, instance_id: str, at: datetime, decision: dict[str, str]) -> None:
        """Keep, after the node is gone, that it powered itself off at `at` and why."""
        self._powered_off_dir.mkdir(parents=True, exist_ok=True)
        path = self._powered_off_dir / f"{instance_id}.json"
        write_atomic(path, json.dumps({"at": at.isoformat(), **decision}) + "\n")

    @property
    def _powered_off_dir(self) -> Path:
        return self.store.root / "powered-off"

    def _poweroff(self, instance_id: str) -> str:
        return poweroff_command(self.settings.home, instance_id, self.settings.local.root)

    def _instance(self, rec: NodeRecord) -> Instance:
        return dataclasses.replace(
            rec.to_instance(),
            poweroff_command=self._poweroff(rec.instance_id),
            container_runtime=self._container_runtime() if rec.mode == "namespace" else None,
        )

    @staticmethod
    def _check_container(request: LaunchRequest, mode: str) -> None:
        """Refuse a container job on loopback nodes, which cannot run it as theirs."""
        if request.container and mode != "namespace":
            raise ProviderError(
                "local nodes run a job's container in namespace mode only; these would be "
                "loopback nodes (sshd on 127.0.0.1, sharing this machine's network and files)",
                hint="run orch as root (local.network: auto or namespace), or run the job "
                "without `container`",
            )

    def _container_runtime(self) -> ContainerRuntime:
        if self._runtime is None:
            self._runtime = local_runtime(self.settings.local.insecure_registries)
        return self._runtime

    # --- spot rehearsal ---------------------------------------------------------------------

    def reclaim(self, instance_id: str, notice_s: float = 0.0) -> datetime | None:
        """Take a running node the way a spot reclaim does; see `local_spot.reclaim`."""
        return local_spot.reclaim(self.store, instance_id, notice_s, self._kill_node)

    def set_spot_available(self, available: bool) -> None:
        """Grant (True) or refuse spot launches from now on, for every job of this ORCH_HOME."""
        local_spot.set_spot_available(self.store, available)

    def follow_trace(
        self, trace: SpotTrace, *, time_scale: float = 1.0, start_tick: int = 0
    ) -> TraceClock:
        """Grant spot launches from now on as `trace` says, replayed `time_scale` times faster
        than wall time from tick `start_tick`; see `local_spot.follow_trace`."""
        return local_spot.follow_trace(
            self.store, trace, time_scale=time_scale, start_tick=start_tick
        )

    def spot_capacity(self) -> local_spot.SpotCapacity:
        """The spot capacity in force (fixed, or a trace and its clock)."""
        return local_spot.read_capacity(self.store)

    # --- what the markets offer (`MarketView`) ------------------------------------------------

    def spot_available(self, nodes: int = 1) -> bool | None:
        """Whether `nodes` spot nodes would be granted now, from the capacity file or trace."""
        return local_spot.spot_available(self.store, nodes)

    def market_prices(self, request: LaunchRequest) -> MarketPrices:
        """USD per node-hour: `local.spot_price` and `local.price_per_hour`."""
        return MarketPrices(spot=self._price("spot"), on_demand=self._price("on-demand"))

    # --- network --------------------------------------------------------------------------------

    def network_mode(self) -> str:
        """The network mode in effect: "namespace" or "loopback" (`auto` resolved)."""
        return self._network.mode()

    def cleanup_network(self) -> bool:
        """Remove the bridge and its firewall rules once no node of any ORCH_HOME uses it;
        True when it is gone afterwards (or, not root, none can have been made). See
        `HostNetwork.cleanup`."""
        return self._network.cleanup()

    # --- launching ------------------------------------------------------------------------------

    def _market(self, request: LaunchRequest) -> Market:
        """Spot when asked for (or cheaper under "auto") and granted; refused spot-only
        launches are a `CapacityError`."""
        if request.spot is False:
            return "on-demand"
        if local_spot.spot_available(self.store, request.count):
            local = self.settings.local
            if request.spot is True or local.spot_price <= local.price_per_hour:
                return "spot"
            return "on-demand"
        if request.spot == "auto":
            return "on-demand"
        raise CapacityError(
            "no spot capacity for local nodes right now",
            hint="retry later, use spot: auto to fall back on on-demand, or "
            "`orch local spot on` to grant spot launches again",
        )

    def _price(self, market: Market) -> Decimal:
        local = self.settings.local
        return local.spot_price if market == "spot" else local.price_per_hour

    def _check_request(self, request: LaunchRequest, market: Market) -> None:
        if request.count < 1:
            raise ProviderError(f"cannot launch {request.count} nodes")
        key = request.public_key.strip()
        if "\n" in key or "\r" in key or not key.startswith(("ssh-", "ecdsa-", "sk-")):
            raise ProviderError("the public key must be one OpenSSH public key line")
        price = self._price(market)
        cap = request.max_price_per_hour
        if cap is not None and price > cap:
            raise CapacityError(
                f"local nodes cost {price} USD/h, above the {cap} USD/h cap",
                hint="raise resources.max_price_per_hour or local.price_per_hour",
            )

    # --- terminating ----------------------------------------------------------------------------

    def _kill_node(self, instance_id: str) -> bool:
        """SIGKILL every process of a node until none is left; False if some survive."""
        rec = self.store.load(instance_id)
        config = self._starter.config_path(instance_id)
        namespaced = os.geteuid() == 0 and (rec is None or rec.mode == "namespace")
        sshd_pid = rec.sshd_pid if rec is not None and rec.sshd_pid else 0
        # The port identifies the node's sshd processes only while the node's own sshd holds
        # it; once that sshd is gone, another ORCH_HOME's node may have taken the port.
        by_port = rec.port if rec is not None and rec.mode == "loopback" else 0
        if not pid_runs(sshd_pid, config):
            sshd_pid = by_port = 0

        def find() -> set[int]:
            pids = pids_with_marker(instance_id)
            if namespaced:
                pids |= netns_pids(instance_id)
            if by_port:
                pids |= sshd_pids_on_port(by_port)
            if sshd_pid and pid_runs(sshd_pid, config):
                pids.add(sshd_pid)
            return pids

        return sweep(find)
