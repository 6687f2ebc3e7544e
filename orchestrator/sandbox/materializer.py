"""The materializer: keeps one host per live moto instance, and none for any other.

Every `interval_s` it describes the region's instances and, in this order:

1. ends the host of every instance that is no longer `pending` or `running` (terminated,
   shutting down, stopped, or forgotten), so an IP moto hands out again is free first;
2. starts building a host for every live instance that has none (in a small thread pool, so a
   launch of many nodes comes up together); once built the instance turns `running`. A host
   that cannot be built makes its instance `terminated` with `Server.InternalError`, as EC2
   does with an instance that fails to launch.

With an SSH delay (`orch sandbox boot --ssh-delay S`), an instance turns `running` as soon as
its host's network is up, and its sshd starts S seconds later: what EC2 does with an image
that takes S seconds to boot, and what a client that takes `running` for "can log in" trips on.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from orchestrator.errors import OrchError
from orchestrator.sandbox.cloud import INTERNAL_ERROR, LIVE, SELF_SHUTDOWN, MotoCloud
from orchestrator.sandbox.hosts import HostFleet, HostSpec

BUILDERS = 8


class Materializer:
    """The polling thread. `start()`, then `stop()` (which waits for builds in flight)."""

    def __init__(
        self,
        cloud: MotoCloud,
        fleet: HostFleet,
        *,
        interval_s: float = 0.3,
        ssh_delay_s: Callable[[], float] = lambda: 0.0,
        log: Callable[[str], None],
    ) -> None:
        self.cloud = cloud
        self.fleet = fleet
        self.interval_s = interval_s
        self.ssh_delay_s = ssh_delay_s
        self.log = log
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=BUILDERS, thread_name_prefix="host-build")
        self._building: set[str] = set()
        self._failed: set[str] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="materializer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except (OrchError, ClientError, BotoCoreError) as exc:
                self.log(f"materializer: {exc}")
            except Exception as exc:  # noqa: BLE001 - the sandbox lives on; the next pass retries
                self.log(f"materializer: unexpected {exc!r}")
            self._stop.wait(self.interval_s)

    def tick(self) -> None:
        """One pass: end the instances whose host shut itself down, end hosts of gone
        instances, start building hosts of new ones."""
        for iid in self.fleet.shutdown_requested():
            if self.cloud.terminate(iid, SELF_SHUTDOWN, "Instance initiated shutdown"):
                self.log(f"host {iid} shut itself down: instance terminated")
        live = {d["InstanceId"]: d for d in self.cloud.instances() if d["State"]["Name"] in LIVE}
        for iid in sorted(self.fleet.ids() - live.keys()):
            with self._lock:
                if iid in self._building:
                    continue  # ended once its build is over (next pass)
            if self.fleet.end(iid):
                self.log(f"host {iid} ended")
        for iid, desc in live.items():
            with self._lock:
                if iid in self._building or iid in self._failed or self.fleet.get(iid):
                    continue
                self._building.add(iid)
            self._pool.submit(self._build, desc)

    def _build(self, desc: dict[str, Any]) -> None:
        iid = desc["InstanceId"]
        try:
            spec = HostSpec(
                instance_id=iid,
                private_ip=desc.get("PrivateIpAddress", ""),
                zone=desc.get("Placement", {}).get("AvailabilityZone", ""),
                user_data=self.cloud.user_data(iid),
                key_pair_public=self.cloud.key_pair_public(desc.get("KeyName")),
                role=profile_name(desc),
            )
            delay = self.ssh_delay_s()

            def running_before_ssh() -> None:
                if self.cloud.mark_running(iid):
                    self.log(f"host {iid} running at {spec.private_ip}, sshd in {delay:g} s")

            host = self.fleet.build(
                spec, ssh_delay_s=delay, on_network=running_before_ssh if delay > 0 else None
            )
            if self.cloud.mark_running(iid) or delay > 0:
                self.log(f"host {iid} up at {host.private_ip} in {host.zone}")
        except Exception as exc:  # noqa: BLE001 - any failure fails this instance's launch
            with self._lock:
                self._failed.add(iid)
            self.log(f"host {iid} failed: {exc}")
            try:
                self.cloud.terminate(iid, INTERNAL_ERROR, "the sandbox could not build its host")
            except Exception as again:  # noqa: BLE001
                self.log(f"host {iid}: terminating it failed too: {again}")
        finally:
            with self._lock:
                self._building.discard(iid)


def profile_name(description: dict[str, Any]) -> str | None:
    """The name of an instance's instance profile (from its ARN), or None without one."""
    arn = (description.get("IamInstanceProfile") or {}).get("Arn") or ""
    return arn.rsplit("/", 1)[-1] or None
