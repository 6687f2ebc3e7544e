"""One security group per cluster: its nodes reach each other on every port, nothing else does.

torchrun's rendezvous store, NCCL and gloo listen on ports chosen at run time and authenticate
no one, so the nodes of one cluster must reach each other on every port while the nodes of
another job, and the controller host, must not. The network's own group (the `orch` group, or
infra/'s) admits SSH only; each launch also puts its nodes into their cluster's group,
`orch-cluster-<digest>`, made in the same VPC when missing, whose one ingress rule admits all
traffic from its own members. A group references itself only, so it never keeps another group
alive.

Lifecycle: made by the first launch of a cluster (`ensure_cluster_group`; a recovery's launch
finds it); deleted by `AwsProvider.terminate` once no instance of it is left
(`delete_unused`). EC2 refuses to delete a group while an instance that is shutting down still
holds it, so the provider waits for those to be terminated first. One that is left over all the
same (a controller killed in between, nodes that took over `TERMINATED_WAIT_S` to terminate, a
launch that never started a node) is deleted by a later terminate or launch of the same owner
(`sweep`), once it is `LEAK_GRACE_S` old and holds no instance. Security groups cost nothing;
they count against the region's quota (2,500 per VPC by default).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from botocore.exceptions import ClientError

from orchestrator.providers.aws.ec2_requests import TAG_CLUSTER, TAG_LEDGER, TAG_OWNER, error_code
from orchestrator.providers.aws.network import CLUSTER_GROUP_PREFIX, find_group

TAG_CREATED = "orch-created"  # UTC time the group was made (ISO 8601), for the sweep's grace
LEAK_GRACE_S = 3600.0  # a cluster group this old without an instance is a leak
TERMINATED_WAIT_S = 180.0  # longest wait at terminate for nodes to leave their cluster's group
# Instance states that still hold a group (terminated ones no longer do).
HOLDING_STATES = ("pending", "running", "stopping", "stopped", "shutting-down")
_NOT_IN_DESCRIPTION = re.compile(r"[^A-Za-z0-9 ._:/()#,@\[\]+=&;{}!$*-]")


def cluster_group_name(ledger_id: str | None, cluster: str) -> str:
    """The group of `cluster` of ledger `ledger_id`: a digest of both, so two ledgers' clusters
    of one name never share a group. Pure."""
    digest = hashlib.sha256(f"{ledger_id or ''}\x1f{cluster}".encode()).hexdigest()[:20]
    return CLUSTER_GROUP_PREFIX + digest


def cluster_group_tags(
    cluster: str, *, owner: str, ledger_id: str | None, now: datetime
) -> dict[str, str]:
    """The tags a cluster's group is made with. Pure."""
    tags = {
        TAG_OWNER: owner,
        TAG_CLUSTER: cluster,
        TAG_CREATED: now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "Name": f"orch-{cluster}",
    }
    if ledger_id is not None:
        tags[TAG_LEDGER] = ledger_id
    return tags


def members_all_traffic(group_id: str) -> dict[str, Any]:
    """All traffic from members of `group_id`, as an `IpPermissions` entry. Pure."""
    return {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": group_id}]}


def _admits_members(group: dict[str, Any]) -> bool:
    return any(
        p.get("IpProtocol") == "-1"
        and any(pair.get("GroupId") == group["GroupId"] for pair in p.get("UserIdGroupPairs") or [])
        for p in group.get("IpPermissions") or []
    )


def ensure_cluster_group(
    ec2: Any,
    vpc_id: str,
    cluster: str,
    *,
    owner: str,
    ledger_id: str | None,
    now: datetime | None = None,
) -> str:
    """The id of `cluster`'s group in `vpc_id`, made (tagged, admitting all traffic between its
    members and nothing else) when missing. Idempotent; a group made meanwhile by another
    launch of the cluster is taken."""
    name = cluster_group_name(ledger_id, cluster)
    found = find_group(ec2, vpc_id, name)
    if found is None:
        tags = cluster_group_tags(cluster, owner=owner, ledger_id=ledger_id,
                                  now=now or datetime.now(UTC))  # fmt: skip
        try:
            group_id = ec2.create_security_group(
                GroupName=name,
                Description=_NOT_IN_DESCRIPTION.sub("_", f"orch cluster {cluster}")[:255],
                VpcId=vpc_id,
                TagSpecifications=[{
                    "ResourceType": "security-group",
                    "Tags": [{"Key": k, "Value": v} for k, v in tags.items()],
                }],
            )["GroupId"]  # fmt: skip
        except ClientError as exc:
            if error_code(exc) != "InvalidGroup.Duplicate":
                raise
            found = find_group(ec2, vpc_id, name)
            if found is None:
                raise
            group_id = found["GroupId"]
    else:
        group_id = found["GroupId"]
    if found is None or not _admits_members(found):
        try:
            ec2.authorize_security_group_ingress(
                GroupId=group_id, IpPermissions=[members_all_traffic(group_id)]
            )
        except ClientError as exc:
            if error_code(exc) != "InvalidPermission.Duplicate":
                raise
    return group_id


def cluster_groups_of(descriptions: Iterable[dict[str, Any]]) -> dict[str, list[str]]:
    """Cluster group id -> ids of the described instances in it. Pure."""
    found: dict[str, list[str]] = {}
    for desc in descriptions:
        for group in desc.get("SecurityGroups") or []:
            if str(group.get("GroupName", "")).startswith(CLUSTER_GROUP_PREFIX):
                found.setdefault(group["GroupId"], []).append(desc["InstanceId"])
    return found


def holders(ec2: Any, group_id: str, states: Iterable[str] = HOLDING_STATES) -> list[str]:
    """Ids of the instances in `states` that are in group `group_id`."""
    pages = ec2.get_paginator("describe_instances").paginate(
        Filters=[
            {"Name": "instance.group-id", "Values": [group_id]},
            {"Name": "instance-state-name", "Values": list(states)},
        ]
    )
    return [i["InstanceId"] for p in pages for r in p["Reservations"] for i in r["Instances"]]


def delete_group(ec2: Any, group_id: str) -> bool:
    """Delete `group_id`; True when it is gone (a group already gone counts), False when EC2
    refuses (an instance still holds it, or the credentials may not)."""
    try:
        ec2.delete_security_group(GroupId=group_id)
    except ClientError as exc:
        return error_code(exc) == "InvalidGroup.NotFound"
    return True


def delete_unused(
    ec2: Any, groups: dict[str, list[str]], wait_ended: Callable[[list[str]], None]
) -> list[str]:
    """Delete each cluster group of `groups` (group id -> its instances just ended) that no
    live instance is left in; returns the ids deleted. A group EC2 refuses to delete while
    the ended instances shut down is tried again once `wait_ended(their ids)` returns (it
    waits until they are terminated). Never raises for a group that stays: `sweep` ends it."""
    deleted = []
    for group_id, ended in groups.items():
        live = [i for i in holders(ec2, group_id) if i not in ended]
        if live:
            continue  # a recovery's survivors or replacements still use it
        if not delete_group(ec2, group_id):
            try:
                wait_ended(ended)
            except Exception:  # noqa: BLE001 - the sweep deletes it later
                continue
            if not delete_group(ec2, group_id):
                continue
        deleted.append(group_id)
    return deleted


def sweep(ec2: Any, owner: str, now: datetime | None = None) -> list[str]:
    """Delete `owner`'s cluster groups that are `LEAK_GRACE_S` old and hold no instance (nor
    one shutting down); another owner's are never touched. Returns the ids deleted."""
    now = now or datetime.now(UTC)
    pages = ec2.get_paginator("describe_security_groups").paginate(
        Filters=[
            {"Name": f"tag:{TAG_OWNER}", "Values": [owner]},
            {"Name": "group-name", "Values": [CLUSTER_GROUP_PREFIX + "*"]},
        ]
    )
    deleted = []
    for group in (g for page in pages for g in page["SecurityGroups"]):
        made = _created(group)
        if made is None or now - made < timedelta(seconds=LEAK_GRACE_S):
            continue
        if not holders(ec2, group["GroupId"]) and delete_group(ec2, group["GroupId"]):
            deleted.append(group["GroupId"])
    return deleted


def _created(group: dict[str, Any]) -> datetime | None:
    tags = {t["Key"]: t["Value"] for t in group.get("Tags") or []}
    try:
        return datetime.strptime(tags.get(TAG_CREATED, ""), "%Y-%m-%dT%H:%M:%SZ").replace(
            tzinfo=UTC
        )
    except ValueError:
        return None
