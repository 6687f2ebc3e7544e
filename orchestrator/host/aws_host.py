"""`orch controller up --provider aws`: the controller host as one small on-demand EC2 instance.

The host runs with the controller host's instance profile (`aws.controller_instance_profile`,
made by infra/ with `controller_host = true`): its orch takes EC2 credentials from its metadata
endpoint. The laptop's AWS keys, profiles and credential files are never written into the
host's environment (only `ORCH_*` settings are passed on, `host_environment`), and `up` refuses
to launch a host without a profile. The daemon runs under systemd where the host was booted
with it, else under the shell supervisor (sandbox hosts).

Billing: the host's lease opens right after the launch (`on_launched`), at the price recorded
then, and closes when `orch controller down` terminates it, or at the time EC2 keeps when its
autostop powered it off (EC2 terminates it on shutdown).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from orchestrator.config import Settings
from orchestrator.errors import ConfigError
from orchestrator.host import record as records
from orchestrator.host.layout import ROLE
from orchestrator.host.record import HostRecord
from orchestrator.host.session import host_identity

if TYPE_CHECKING:
    from orchestrator.providers.aws.provider import AwsProvider

# What the host's orch must not inherit from the laptop: where the laptop's files are, and
# settings that only make sense on the laptop.
LAPTOP_ONLY = ("ORCH_AWS_TF_OUTPUTS", "ORCH_AWS_CONTROLLER_ENDPOINT_URL",
               "ORCH_AWS_CONTROLLER_INSTANCE_PROFILE")  # fmt: skip


def aws_host_environment(
    passed: Mapping[str, str], *, endpoint_url: str | None, ssh_cidr: str | None
) -> dict[str, str]:
    """The host's settings from the laptop's passed-on `ORCH_*` ones: EC2 at `endpoint_url`
    as the host reaches it, and the `orch` group's SSH rule kept as the laptop sets it (so the
    host's launches do not shut the laptop out). No AWS credential of any kind. Pure."""
    env = {k: v for k, v in passed.items() if k.startswith("ORCH_") and k not in LAPTOP_ONLY}
    if endpoint_url:
        env["ORCH_AWS_ENDPOINT_URL"] = endpoint_url
    if ssh_cidr:
        env["ORCH_AWS_SSH_CIDR"] = ssh_cidr
    # Inside the VPC: the group lets members in, its SSH rule only the laptop's address.
    env["ORCH_AWS_CONNECT_PRIVATE"] = "true"
    return env


def launch(
    settings: Settings,
    *,
    instance_type: str,
    autostop_s: float,
    environ: Mapping[str, str],
    on_launched: Callable[[HostRecord], None] | None = None,
) -> dict[str, Any]:
    """Launch the host on EC2 and set it up (see the module docstring); returns its status
    document. A launch that fails after the instance started is terminated before this raises
    (its lease is closed by the caller)."""
    from orchestrator.host.lifecycle import host_environment, install
    from orchestrator.providers.aws import network as aws_network
    from orchestrator.providers.aws.host_node import launch_host
    from orchestrator.providers.aws.node_launcher import LOCAL_CLOUD_GUARD_POWEROFF
    from orchestrator.providers.aws.provider import AwsProvider

    profile = settings.aws.controller_instance_profile
    if not profile:
        raise ConfigError(
            "the controller host needs AWS credentials of its own, and no instance profile is "
            "configured for it (your own keys are never copied to it)",
            hint="apply infra/ with controller_host = true and set "
            "aws.controller_instance_profile (ORCH_AWS_CONTROLLER_INSTANCE_PROFILE) to its "
            "`controller_instance_profile` output",
        )
    identity = host_identity(settings.home, None)
    provider = AwsProvider(settings)
    node = launch_host(
        provider, role=ROLE, public_key=identity.public_key, instance_type=instance_type,
        instance_profile=profile,
    )  # fmt: skip
    draft = HostRecord(
        kind="launched", user=node.ssh_user, host=node.ssh_host, port=node.ssh_port,
        host_key=node.host_key, identity=str(identity.private_key), root="",
        autostop_s=autostop_s, version="", installed_at="", instance_id=node.instance_id,
        provider="aws", price_per_hour=str(node.price_per_hour),
        launched_at=node.launched_at.isoformat(),
    )  # fmt: skip
    records.save(settings.home, draft)  # before anything else: `down` can end it from now on
    try:
        if on_launched is not None:
            on_launched(draft)
        local = aws_network.is_local_endpoint(settings.aws.endpoint_url)
        vpc_cidr = _vpc_cidr(provider, node.region or provider.regions()[0], node.instance_id)
        try:
            cidr = aws_network.ssh_cidr(settings.aws, vpc_cidr) if vpc_cidr else None
        except ConfigError:  # no `orch` group to keep: the network is given (infra/)
            cidr = None
        env = aws_host_environment(
            host_environment(environ),
            endpoint_url=settings.aws.controller_endpoint_url or settings.aws.endpoint_url,
            ssh_cidr=cidr,
        )
        # EC2 terminates the host on shutdown (its billing stops); a cloud on this machine
        # gives its hosts a `shutdown` of their own at the guard's path.
        poweroff = LOCAL_CLOUD_GUARD_POWEROFF if local else "sudo -n shutdown -h now"
        return install(settings, draft, environ, poweroff=poweroff, passed=env, systemd=True)
    except BaseException:
        provider.terminate([node.instance_id])
        records.forget(settings.home)
        raise


def _vpc_cidr(provider: AwsProvider, region: str, instance_id: str) -> str | None:
    """The CIDR block of the host's VPC (where the laptop's SSH rule is computed from)."""
    ec2 = provider.client(region)
    (desc,) = provider._describe(region, [instance_id])
    vpc_id = desc.get("VpcId")
    if not vpc_id:
        return None
    vpcs = ec2.describe_vpcs(VpcIds=[vpc_id])["Vpcs"]
    return vpcs[0]["CidrBlock"] if vpcs else None
