"""The start's container step: the job's image on every node, pulled at once, with progress
and an event; the nodes' runtime and plans come from the spec and the provider's instances."""

from __future__ import annotations

from orchestrator.cluster.connections import Cluster
from orchestrator.cluster.image_pull import pull_image
from orchestrator.control.run.journal import Journal
from orchestrator.control.run.options import Reporter
from orchestrator.errors import ContainerError
from orchestrator.node.container import PullPlan
from orchestrator.node.launch import NodeLayout, home_expr
from orchestrator.providers.base import Instance
from orchestrator.spec.model import JobSpec


def pull_plans(spec: JobSpec, layout: NodeLayout, instances: list[Instance]) -> list[PullPlan]:
    """Each node's pull, by rank. Raises `ContainerError` when a node cannot run containers."""
    container = spec.container
    if container is None:
        return []
    cannot = [i.instance_id for i in instances if i.container_runtime is None]
    if cannot:
        raise ContainerError(
            f"node(s) {', '.join(cannot)} cannot run the job's container {container.image}",
            hint="local nodes run containers in namespace mode only (orch as root, "
            "local.network: namespace or auto); elsewhere, run the job without `container`",
        )
    ref = container.ref
    login = container.credentials
    plans = []
    for instance in instances:
        runtime = instance.container_runtime
        assert runtime is not None
        plans.append(
            PullPlan(
                image=container.image,
                registry=ref.registry,
                runtime=runtime,
                auth_dir=home_expr(f"{layout.run_dir}/registry-auth"),
                always=container.pull == "always",
                username=login.username if login is not None else None,
                ecr_region=(ref.ecr_region if login is None and runtime.kind == "docker" else None),
                needs_torchrun=spec.launcher == "torchrun",
            )
        )
    return plans


def have_image(
    cluster: Cluster, spec: JobSpec, layout: NodeLayout, journal: Journal, reporter: Reporter
) -> None:
    """Pull the spec's image on every node of `cluster`, reporting progress;
    an IMAGE event says how it came (pulled, in how long, or already there). Nothing when
    the spec has no container."""
    container = spec.container
    if container is None:
        return
    plans = pull_plans(spec, layout, list(cluster.instances))
    login = container.credentials
    password = spec.secrets.get(login.password_secret) if login is not None else None
    report = pull_image(cluster, plans, password=password, progress=reporter.phase)
    journal.event("IMAGE", report.describe(container.image))
