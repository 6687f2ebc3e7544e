"""What ended EC2 nodes leave behind: their cluster groups and their job profiles.

`Leftovers.end(described)` runs after `AwsProvider.terminate` has seen the nodes end: per
region, the cluster groups (`cluster_network`) of the ended nodes that no instance is left in
are deleted (waiting, where EC2 asks for it, until the nodes are terminated), then this owner's
leaked groups there are swept; then the job profiles (`node_roles`) of the ended nodes that no
live instance holds are deleted, and this owner's leaked ones swept. `sweep_groups` and
`sweep_job_profiles` are the sweeps alone, which launches also run.

None of them raises: a group or profile left behind costs nothing and a later terminate,
launch or sweep deletes it.
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError
from botocore.parsers import ResponseParserError

from orchestrator.errors import OrchError
from orchestrator.providers.aws import cluster_network, node_roles
from orchestrator.providers.aws.ec2_requests import LIVE_STATES, TAG_JOB

if TYPE_CHECKING:
    from orchestrator.providers.aws.node_launcher import NodeLauncher
    from orchestrator.providers.aws.provider import AwsProvider

_AWS_ERRORS = (ClientError, BotoCoreError, ResponseParserError)


class Leftovers:
    """The cleanup after the nodes of one `AwsProvider` ended: its clients and descriptions are
    the provider's, its waits and the per-job policy the launcher's."""

    def __init__(self, provider: AwsProvider, launcher: NodeLauncher) -> None:
        self.provider = provider
        self.launcher = launcher

    def end(self, described: dict[str, list[dict[str, Any]]]) -> None:
        """Delete what the ended nodes (their descriptions, by region) leave that nothing else
        uses, then sweep this owner's leaked groups and profiles. Never raises."""
        for region, descriptions in described.items():
            self._end_cluster_groups(region, descriptions)
        self._end_job_profiles([d for found in described.values() for d in found])

    def sweep_groups(self, region: str) -> list[str]:
        """Delete this owner's cluster groups in `region` that were left behind (made over
        `cluster_network.LEAK_GRACE_S` ago, no instance in them); returns their ids."""
        try:
            return cluster_network.sweep(self.provider.client(region), self.provider.owner)
        except _AWS_ERRORS:
            return []

    def sweep_job_profiles(self) -> list[str]:
        """Delete this owner's job profiles left behind (`node_roles.sweep`); returns them."""
        policy = self.launcher.job_policy()
        if policy is None:
            return []
        try:
            return node_roles.sweep(
                self.provider.iam_client(), self.provider.owner, self._profiles_in_use(), policy
            )
        except (OrchError, *_AWS_ERRORS):
            return []

    def _end_cluster_groups(self, region: str, descriptions: list[dict[str, Any]]) -> None:
        groups = cluster_network.cluster_groups_of(descriptions)
        ec2 = self.provider.client(region)

        def wait_terminated(ended: list[str]) -> None:
            wait_s = min(self.provider.aws.ready_timeout_s, cluster_network.TERMINATED_WAIT_S)
            self.launcher.wait(region, ended, frozenset({"terminated"}), "terminated",
                               deadline=time.monotonic() + wait_s)  # fmt: skip

        with contextlib.suppress(*_AWS_ERRORS):  # swept later
            cluster_network.delete_unused(ec2, groups, wait_terminated)
        self.sweep_groups(region)

    def _profiles_in_use(self) -> set[str]:
        """The job profiles (`node_roles`) that live orch instances hold, in every region."""
        live = [{"Name": "tag-key", "Values": [TAG_JOB]},
                {"Name": "instance-state-name", "Values": list(LIVE_STATES)}]  # fmt: skip
        return {p for r in self.provider.regions() for p in node_roles.job_profiles_of(
            self.provider._describe_filtered(r, live))}  # fmt: skip

    def _end_job_profiles(self, descriptions: list[dict[str, Any]]) -> None:
        policy = self.launcher.job_policy()
        ended = node_roles.job_profiles_of(descriptions)
        if policy is None and not ended:
            return
        with contextlib.suppress(OrchError, *_AWS_ERRORS):
            in_use = self._profiles_in_use()
            for name in ended - in_use:
                node_roles.delete_job_profile(self.provider.iam_client(), name, policy)
            if policy is not None:
                node_roles.sweep(self.provider.iam_client(), self.provider.owner, in_use, policy)
