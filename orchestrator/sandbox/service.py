"""The running sandbox: starts every part, answers the control API, and removes it all again.

`Sandbox.start()` returns the endpoint once it can be used; `stop()` ends every host and removes
every namespace, veth, the bridge, the state directory and the server, in that order. Only one
sandbox runs on a machine at a time (it holds `/run/lock/orch-sandbox.lock`); a sandbox that
finds namespaces or a bridge of an earlier one that was killed removes them before starting.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any

from orchestrator.atomic import write_atomic
from orchestrator.providers.aws.catalog import load_catalog
from orchestrator.providers.local import kit
from orchestrator.sandbox import hostnet
from orchestrator.sandbox.capacity import Capacity
from orchestrator.sandbox.cloud import (
    SPOT_TERMINATION,
    MotoCloud,
    require_moto,
    write_image_file,
)
from orchestrator.sandbox.errors import SandboxError
from orchestrator.sandbox.gateway import ControlError, Gateway
from orchestrator.sandbox.hosts import HostFleet, end_host, kill_namespace
from orchestrator.sandbox.materializer import Materializer
from orchestrator.sandbox.network import SandboxNetwork
from orchestrator.sandbox.pricing import PriceTable, price_table

LOCK_FILE = Path("/run/lock/orch-sandbox.lock")
ZONE_COUNT = 3


class Sandbox:
    """One sandbox: moto + gateway on 127.0.0.1:`port`, hosts under `state_dir`.

    The constructor does no I/O. `start()` once, then `stop()` (always, also after a failed
    start: it removes whatever was made).
    """

    def __init__(
        self,
        state_dir: Path,
        *,
        region: str = "us-east-1",
        port: int = 0,
        network: SandboxNetwork | None = None,
        log: Callable[[str], None] = print,
    ) -> None:
        self.state_dir = state_dir
        self.region = region
        self.port = port
        self.network = network or SandboxNetwork()
        self.log = log
        self.cloud = MotoCloud(region, self.network)
        self.capacity = Capacity()
        self.prices: PriceTable | None = None
        self.endpoint: str | None = None
        self.host_endpoint: str | None = None  # the same endpoint as the hosts reach it (S3)
        self._host_server: Any = None
        self.fleet: HostFleet | None = None
        self._lock_fh: IO[str] | None = None
        self._server: Any = None
        self._server_thread: threading.Thread | None = None
        self._materializer: Materializer | None = None
        self._bridge_made = False
        self._stopping = threading.Event()
        self._reclaims: dict[str, dict[str, Any]] = {}
        self._reclaim_threads: list[threading.Thread] = []
        self._reclaims_lock = threading.Lock()
        self._ssh_delay_s = 0.0  # seconds from `running` to sshd, for hosts built from now on

    # --- start / stop ---------------------------------------------------------------------------

    def start(self) -> str:
        """Bring the sandbox up; returns its endpoint URL (http://127.0.0.1:PORT)."""
        require_moto()  # before anything is made or removed
        self._preflight()
        self._take_lock()
        self._remove_leftovers()
        self.state_dir.mkdir(mode=0o700, parents=True)
        MotoCloud.load(write_image_file(self.state_dir / "images.json"))
        zones = self.cloud.zones(ZONE_COUNT)
        self.prices = price_table(load_catalog(), self.region, zones)
        for argv in hostnet.bridge_setup_argvs(self.network):
            kit.run_checked(argv)
        self._bridge_made = True
        gateway = Gateway(self.cloud.app(), prices=self.prices, capacity=self.capacity,
                          hooks=self, lock=self.cloud.lock)  # fmt: skip
        self._serve(gateway)
        self._serve_hosts(gateway)
        assert self.endpoint is not None
        self.cloud.attach(self.endpoint)
        self.cloud.prepare_network(zones)
        self.fleet = HostFleet(self.state_dir, self.network, log=self.log)
        self._materializer = Materializer(
            self.cloud, self.fleet, ssh_delay_s=lambda: self._ssh_delay_s, log=self.log
        )
        self._materializer.start()
        return self.endpoint

    @property
    def started(self) -> bool:
        """Whether this sandbox got as far as owning the machine's sandbox (its lock)."""
        return self._lock_fh is not None

    def stop(self) -> None:
        """End every host and remove everything the sandbox made. Safe to call more than once;
        does nothing when the sandbox never took the lock (what exists is another's)."""
        if not self.started:
            return
        self._stopping.set()
        if self._materializer is not None:
            self._materializer.stop()
        for thread in self._reclaim_threads:
            thread.join(timeout=30)
        if self.fleet is not None:
            self.fleet.end_all()
        self._remove_leftovers()
        if self._bridge_made:
            subprocess.run(hostnet.bridge_delete_argv(self.network), capture_output=True)
            self._bridge_made = False
        for server in (self._server, self._host_server):
            if server is not None:
                server.shutdown()
                server.server_close()
        self._server = self._host_server = None
        if self._lock_fh is not None:
            self._lock_fh.close()
            self._lock_fh = None

    def _preflight(self) -> None:
        if os.geteuid() != 0:
            raise SandboxError(
                "the sandbox needs root: its hosts are network namespaces on a bridge",
                hint="run `orch sandbox aws` as root",
            )
        for tool in ("ip", "unshare", "ssh-keygen"):
            if shutil.which(tool) is None:
                raise SandboxError(f"the sandbox needs `{tool}`", hint="install iproute2, "
                                   "util-linux and openssh-server")  # fmt: skip

    def _take_lock(self) -> None:
        LOCK_FILE.parent.mkdir(parents=True, exist_ok=True)
        handle = open(LOCK_FILE, "a+")  # noqa: SIM115 - held for the sandbox's whole life
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            raise SandboxError(
                f"another orch sandbox runs on this machine (it holds {LOCK_FILE})",
                hint="stop it (Ctrl-C or SIGTERM) before starting a new one",
            ) from None
        self._lock_fh = handle

    def _remove_leftovers(self) -> None:
        """Remove hosts, bridge and state a sandbox left (this one, or one that was killed)."""
        listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
        names = [line.split()[0] for line in listing.stdout.splitlines() if line.strip()]
        stale = [n for n in names if n.startswith(hostnet.NETNS_PREFIX)]
        for name in stale:
            kill_namespace(name)
            end_host(name.removeprefix(hostnet.NETNS_PREFIX), None)
        if stale and not self._bridge_made:
            self.log(f"removed {len(stale)} host(s) left by a sandbox that did not stop cleanly")
        if not self._bridge_made:
            subprocess.run(hostnet.bridge_delete_argv(self.network), capture_output=True)
        shutil.rmtree(self.state_dir, ignore_errors=True)

    def _serve(self, gateway: Gateway) -> None:
        try:
            server = _listen("127.0.0.1", self.port, gateway)
        except OSError as exc:
            raise SandboxError(
                f"cannot listen on 127.0.0.1:{self.port}: {exc}",
                hint="choose another port with --port (0: any free one)",
            ) from exc
        self._server = server
        self.endpoint = f"http://127.0.0.1:{server.server_port}"
        self._server_thread = threading.Thread(
            target=server.serve_forever, name="sandbox-endpoint", daemon=True
        )
        self._server_thread.start()

    def _serve_hosts(self, gateway: Gateway) -> None:
        """The same endpoint on the bridge's address, the one the hosts reach (their nodes
        upload checkpoints to its S3), on a port of its own."""
        address = str(self.network.gateway)
        try:
            server = _listen(address, 0, gateway)
        except OSError as exc:
            raise SandboxError(f"cannot listen on {address} for the hosts: {exc}") from exc
        self._host_server = server
        self.host_endpoint = f"http://{address}:{server.server_port}"
        threading.Thread(
            target=server.serve_forever, name="sandbox-host-endpoint", daemon=True
        ).start()

    # --- gateway hooks ----------------------------------------------------------------------

    def zone_of_subnet(self, subnet_id: str) -> str | None:
        return self.cloud.zone_of_subnet(subnet_id)

    def launched(self, instance_ids: list[str]) -> None:
        try:
            self.cloud.mark_booting(instance_ids)
        except Exception as exc:  # noqa: BLE001 - the launch stands; say what went wrong
            self.log(f"could not hold {', '.join(instance_ids)} pending while they boot: {exc}")

    def status(self) -> dict:
        """The control API's status document (JSON-ready)."""
        assert self.prices is not None and self.fleet is not None
        subnets = self.network.subnets(list(self.prices.zones))
        with self._reclaims_lock:
            reclaims = [dict(r) for r in self._reclaims.values()]
        return {
            "endpoint": self.endpoint,
            "host_endpoint": self.host_endpoint,
            "region": self.region,
            "zones": list(self.prices.zones),
            "subnets": {
                zone: {"id": self.cloud.subnets.get(zone), "cidr": str(block)}
                for zone, block in subnets.items()
            },
            "bridge": self.network.bridge,
            "cidr": str(self.network.cidr),
            "prices": self.prices.rows(),
            "refused": self.capacity.refused(),
            "hosts": [host.as_dict() for host in self.fleet.all()],
            "reclaims": reclaims,
            "ssh_delay_s": self._ssh_delay_s,
        }

    def boot(self, ssh_delay_s: float) -> dict:
        """From now on, instances turn `running` `ssh_delay_s` seconds before their sshd
        starts (0: only once it answers, the default)."""
        self._ssh_delay_s = ssh_delay_s
        self.log(f"boot: sshd starts {ssh_delay_s:g} s after an instance turns running")
        return {"ssh_delay_s": ssh_delay_s}

    def preempt(self, instance_id: str, notice_s: float) -> dict:
        """Reclaim a spot instance like EC2: serve the notice in its metadata for `notice_s`
        seconds, then terminate it (state reason `Server.SpotInstanceTermination`) and end its
        host at once. Returns the reclaim's record; the rest happens in the background."""
        assert self.fleet is not None
        host = self.fleet.get(instance_id)
        desc = self.cloud.describe(instance_id) if host is not None else None
        if host is None or desc is None or desc["State"]["Name"] != "running":
            raise ControlError(f"no running sandbox instance {instance_id!r}", 404)
        if desc.get("InstanceLifecycle") != "spot":
            raise ControlError(
                f"{instance_id} is an on-demand instance: EC2 reclaims only spot", 409
            )
        now = datetime.now(UTC)
        at = now + timedelta(seconds=notice_s)
        with self._reclaims_lock:
            if instance_id in self._reclaims:
                raise ControlError(f"{instance_id} is already being reclaimed", 409)
            record = {
                "instance_id": instance_id,
                "noticed_at": now.isoformat(),
                "terminate_at": at.isoformat(),
                "notice": hostnet.notice_document(at),
                "done": False,
            }
            self._reclaims[instance_id] = record
        write_atomic(host.notice_file, json.dumps(hostnet.notice_document(at)) + "\n")
        self.log(f"reclaim {instance_id}: notice served until {record['terminate_at']}")
        thread = threading.Thread(
            target=self._reclaim, args=(instance_id, notice_s), name=f"reclaim-{instance_id}"
        )
        self._reclaim_threads.append(thread)
        thread.start()
        return dict(record)

    def _reclaim(self, instance_id: str, notice_s: float) -> None:
        if self._stopping.wait(notice_s):
            return  # the sandbox stops: every host ends anyway
        assert self.fleet is not None
        try:
            self.cloud.terminate(instance_id, SPOT_TERMINATION, "Spot instance termination")
            self.fleet.end(instance_id)
        except Exception as exc:  # noqa: BLE001 - reported; the materializer ends the host
            self.log(f"reclaim {instance_id} failed: {exc}")
            return
        with self._reclaims_lock:
            self._reclaims[instance_id]["done"] = True
        self.log(f"reclaimed {instance_id}: terminated ({SPOT_TERMINATION}), host ended")


def _listen(address: str, port: int, gateway: Gateway) -> Any:
    """A threaded HTTP server of `gateway` on `address:port` (0: any free port), not serving."""
    from moto.moto_server.werkzeug_app import MotoRequestHandler
    from werkzeug.serving import make_server

    class QuietHandler(MotoRequestHandler):
        def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
            pass

    return make_server(address, port, gateway, threaded=True, request_handler=QuietHandler)
