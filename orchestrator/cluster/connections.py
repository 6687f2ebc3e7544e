"""A launched cluster as the controller sees it: its instances and one SSH connection each.

This is the one place where provider output (instances) meets the SSH layer (connections);
neither of those two packages knows the other.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from orchestrator.errors import RemoteError
from orchestrator.providers.base import Instance
from orchestrator.remote.keys import HostAddress, Identity, pin_hosts
from orchestrator.remote.ssh import NodeConnection

T = TypeVar("T")


def host_address(instance: Instance) -> HostAddress:
    return HostAddress(
        name=f"node {instance.rank} ({instance.instance_id})",
        host=instance.ssh_host,
        port=instance.ssh_port,
        user=instance.ssh_user,
        host_key=instance.host_key,
        home=instance.home,
        proxy_jump=instance.proxy_jump,
    )


class Cluster:
    """Nodes of one launch, ordered by rank, with persistent connections (opened lazily).

    Building it pins the nodes' host keys in the cluster's known_hosts (used by rsync) and does
    no network I/O.
    """

    def __init__(
        self,
        instances: Sequence[Instance],
        identity: Identity,
        *,
        connect_timeout: float = 10.0,
        command_timeout: float = 120.0,
    ) -> None:
        self.instances = sorted(instances, key=lambda i: i.rank)
        self.identity = identity
        self.addresses = [host_address(i) for i in self.instances]
        pin_hosts(identity, self.addresses)
        self.connections = [
            NodeConnection(
                address,
                identity,
                connect_timeout=connect_timeout,
                command_timeout=command_timeout,
            )
            for address in self.addresses
        ]
        self._pool = ThreadPoolExecutor(max_workers=max(1, min(32, len(self.instances))))

    @property
    def head(self) -> NodeConnection:
        return self.connections[0]

    def map(self, fn: Callable[[int, NodeConnection], T]) -> list[T]:
        """Run `fn(rank, connection)` on every node concurrently; results in rank order.

        Every call finishes before the first error (if any) is raised, so no work is left
        running behind the caller's back.
        """
        futures = [self._pool.submit(fn, rank, c) for rank, c in enumerate(self.connections)]
        results: list[T] = []
        errors: list[BaseException] = []
        for future in futures:
            try:
                results.append(future.result())
            except BaseException as exc:  # noqa: BLE001 - re-raised below after all finished
                errors.append(exc)
        if errors:
            first = errors[0]
            if len(errors) > 1 and isinstance(first, RemoteError):
                first.message += f" (and {len(errors) - 1} more node(s) failed)"
            raise first
        return results

    def close(self) -> None:
        for connection in self.connections:
            connection.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
