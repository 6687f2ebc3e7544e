"""Pure: the one translation of a job spec into a provider's `LaunchRequest`.

A submit's dry run, the controller's launches and the spot policy's price questions all ask
for the same nodes; only what a launch alone knows (its key, guard, attempt, the zones to
avoid) differs, and it is passed in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from orchestrator.providers.base import LaunchRequest

if TYPE_CHECKING:
    from orchestrator.node.guard_protocol import GuardTerms
    from orchestrator.spec.model import JobSpec


def launch_request(
    spec: JobSpec,
    job_id: str,
    *,
    public_key: str = "",
    spot: bool | Literal["auto"] | None = None,
    avoid_zones: tuple[str, ...] = (),
    zones: tuple[str, ...] | None = None,
    guard: GuardTerms | None = None,
    ledger_id: str | None = None,
    attempt: int = 0,
) -> LaunchRequest:
    """The request for `spec`'s nodes (one cluster named after job `job_id`): count, GPUs,
    accelerator, price cap, GPU memory, disk, placement (types, regions, zones, image, ports),
    checkpoint store and container (whether the nodes log in to Amazon ECR with their
    instance role) all come from the spec.

    `spot` overrides `resources.spot` (None: the spec's), as a spot policy picks the market of
    each launch; `zones` overrides `resources.zone` with a zone-aware policy's choice, in its
    order of preference (None: the spec's zones, a filter only). The defaults (no key, no
    guard, no ledger) make a request fit only for planning and pricing, never for
    `Provider.launch`.
    """
    resources = spec.resources
    return LaunchRequest(
        job_id=job_id,
        cluster=job_id,
        count=resources.nodes,
        gpus_per_node=resources.gpus_per_node,
        public_key=public_key,
        spot=resources.spot if spot is None else spot,
        accelerator=resources.accelerator,
        max_price_per_hour=resources.max_price_per_hour,
        min_gpu_memory_gb=resources.min_gpu_memory_gb,
        disk_size_gb=resources.disk_size_gb,
        instance_types=tuple(resources.instance_type or ()),
        regions=tuple(resources.region or ()),
        zones=tuple(resources.zone or ()) if zones is None else zones,
        zones_ordered=zones is not None,
        image=resources.image,
        ports=tuple(resources.ports),
        avoid_zones=avoid_zones,
        store=spec.checkpoint.store,
        guard=guard,
        ledger_id=ledger_id,
        attempt=attempt,
        container=spec.container is not None,
        ecr_login=spec.container is not None
        and spec.container.credentials is None
        and spec.container.ref.ecr_region is not None,
        buckets=bool(spec.outputs) or any(mount.bucket_url for mount in spec.data),
        fleet=spec.fleet,
    )
