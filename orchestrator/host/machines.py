"""The provider that launched a controller host, for what `up`, `status` and `down` ask of it:
whether the host ended itself (autostop) and when, whether it is gone, and ending it.

A record without a provider (hosts launched before providers were recorded) is a local one.
What the provider says decides whether a host that does not answer over SSH is gone: SSH alone
never does (`replacement.probe`).
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from orchestrator.config import Settings
from orchestrator.host.record import HostRecord

if TYPE_CHECKING:
    from orchestrator.providers.aws.provider import AwsProvider
    from orchestrator.providers.local.provider import LocalProvider


def _provider(settings: Settings, record: HostRecord) -> AwsProvider | LocalProvider:
    if record.provider == "aws":
        from orchestrator.providers.aws.provider import AwsProvider

        return AwsProvider(settings)
    from orchestrator.providers.local.provider import LocalProvider

    return LocalProvider(settings)


def self_ended_at(settings: Settings, record: HostRecord) -> datetime | None:
    """When the launched host of `record` ended itself (its autostop's poweroff), as its
    provider keeps it: its billing stopped then. None while it runs, or when it was ended
    otherwise."""
    if record.kind != "launched" or not record.instance_id:
        return None
    ended = _provider(settings, record).self_ended([record.instance_id]).get(record.instance_id)
    return ended.at if ended is not None else None


RUNNING, STOPPED, GONE = "running", "stopped", "gone"


def state(settings: Settings, record: HostRecord) -> str:
    """What the provider says of the launched host's machine: `running` (or starting),
    `stopped` (EC2's stopping or stopped: it runs no orch) or `gone` (ending, ended, or
    unknown to it). An adopted host has no provider: `running`."""
    if record.kind != "launched" or not record.instance_id:
        return RUNNING
    if record.provider == "aws":
        from orchestrator.providers.aws.ec2_requests import GONE_STATES
        from orchestrator.providers.aws.provider import AwsProvider

        provider = AwsProvider(settings)
        for region in provider.regions():
            for desc in provider._describe(region, [record.instance_id]):
                name = desc["State"]["Name"]
                return GONE if name in GONE_STATES else (
                    STOPPED if name in ("stopping", "stopped") else RUNNING)  # fmt: skip
        return GONE
    from orchestrator.providers.local.provider import LocalProvider

    node = LocalProvider(settings).store.load(record.instance_id)
    return GONE if node is None or node.reclaimed_at is not None else RUNNING


def terminate(settings: Settings, record: HostRecord) -> datetime:
    """End the launched host's machine; returns when its billing stopped (the provider's
    acknowledgement). `InstancesNotFound` when its provider does not know it."""
    assert record.instance_id is not None
    return _provider(settings, record).terminate([record.instance_id])
