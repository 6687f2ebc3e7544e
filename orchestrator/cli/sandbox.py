"""`orch sandbox ...`: start a local cloud, and steer the one that runs.

    orch sandbox aws [--port P] [--region R]          foreground; prints `ready` and the endpoint
    orch sandbox status [--json]                      zones, prices, capacity, hosts, reclaims
    orch sandbox preempt INSTANCE [--notice S]        spot-reclaim an instance after S s of notice
    orch sandbox capacity ZONE... [--market M] [--restore]   no capacity in a zone (or back)
    orch sandbox boot --ssh-delay S                   `running` S seconds before sshd answers

The steering commands find the sandbox at `--endpoint` or `ORCH_AWS_ENDPOINT_URL`.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from typing import Annotated

import typer

from orchestrator.cli.context import load_settings
from orchestrator.cli.flags import DURATION_METAVAR, duration
from orchestrator.errors import SpecError

DEFAULT_PORT = 5055

sandbox_app = typer.Typer(
    name="sandbox",
    help="A local cloud (moto + namespace hosts) to rehearse --provider aws without an account.",
    no_args_is_help=True,
)

EndpointOption = Annotated[
    str | None,
    typer.Option("--endpoint", help="sandbox URL [ORCH_AWS_ENDPOINT_URL]", show_default=False),
]


def _say(text: str) -> None:
    try:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    except OSError:  # nobody reads the output any more; the sandbox goes on (or cleans up)
        pass


@sandbox_app.command("aws")
def aws(
    port: Annotated[int, typer.Option("--port", help="port on 127.0.0.1 (0: any free one)")] = (
        DEFAULT_PORT
    ),
    region: Annotated[str, typer.Option("--region", help="the sandbox's region")] = "us-east-1",
) -> None:
    """Run a local EC2 (moto) whose instances are real hosts; Ctrl-C or SIGTERM removes it all."""
    from orchestrator.sandbox.service import Sandbox

    if not 0 <= port <= 65535:
        raise SpecError(f"--port {port} is not a port number")
    stop = threading.Event()

    def request_stop(signum: int, frame: object) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    sandbox = Sandbox(load_settings().home / "sandbox", region=region, port=port, log=_say)
    try:
        endpoint = sandbox.start()
        zones = ", ".join(sandbox.prices.zones) if sandbox.prices else ""
        _say(
            f"sandbox ready: {endpoint} (region {region}, zones {zones};"
            f" hosts on {sandbox.network.bridge} {sandbox.network.cidr})"
        )
        _say(
            f"  use it: export ORCH_AWS_ENDPOINT_URL={endpoint}"
            " AWS_ACCESS_KEY_ID=sandbox AWS_SECRET_ACCESS_KEY=sandbox"
        )
        _say(
            f"  and for a checkpoint store on its S3: export ORCH_STORE_ENDPOINT_URL={endpoint}"
            f" ORCH_STORE_NODE_ENDPOINT_URL={sandbox.host_endpoint}"
        )
        while not stop.wait(0.5):
            pass
        _say("sandbox stopping: ending every host")
    finally:
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)  # a second Ctrl-C must not cut the cleanup short
        if sandbox.started:
            began = time.monotonic()
            sandbox.stop()
            _say(
                f"sandbox stopped: everything it made is removed ({time.monotonic() - began:.1f} s)"
            )


def _client(endpoint: str | None):  # noqa: ANN202 - a SandboxClient, imported lazily
    from orchestrator.sandbox.client import SandboxClient

    url = endpoint or load_settings().aws.endpoint_url
    if not url:
        raise SpecError(
            "which sandbox? no --endpoint and no ORCH_AWS_ENDPOINT_URL",
            hint="pass the URL `orch sandbox aws` printed",
        )
    return SandboxClient(url)


@sandbox_app.command("status")
def status(
    endpoint: EndpointOption = None,
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON document")] = False,
) -> None:
    """The sandbox's zones, spot prices, capacity refusals, hosts and reclaims."""
    document = _client(endpoint).status()
    if json_out:
        _say(json.dumps(document, indent=2))
        return
    _say(f"{document['endpoint']}  region {document['region']}  {document['bridge']} "
         f"{document['cidr']}")  # fmt: skip
    for zone in document["zones"]:
        subnet = document["subnets"][zone]
        refused = [r["market"] for r in document["refused"] if r["zone"] == zone]
        note = f"  no capacity: {', '.join(refused)}" if refused else ""
        _say(f"  {zone}  {subnet['id']}  {subnet['cidr']}{note}")
    if document.get("ssh_delay_s"):
        _say(f"  boot: instances turn running {document['ssh_delay_s']:g} s before sshd answers")
    for host in document["hosts"]:
        _say(f"  host {host['instance_id']}  {host['private_ip']}  {host['zone']}")
    for reclaim in document["reclaims"]:
        state = "done" if reclaim["done"] else f"terminates at {reclaim['terminate_at']}"
        _say(f"  reclaim {reclaim['instance_id']}: {state}")


@sandbox_app.command("preempt")
def preempt(
    instance: Annotated[str, typer.Argument(help="instance id (i-...)", show_default=False)],
    notice: Annotated[
        float,
        typer.Option(
            "--notice",
            parser=duration,
            metavar=DURATION_METAVAR,
            help="how long the notice is served before the end (120, 2m)",
        ),
    ] = 120.0,
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="return once it is gone")] = True,
    endpoint: EndpointOption = None,
) -> None:
    """Reclaim a spot instance as EC2 does: a notice in its metadata for --notice seconds, then
    terminated with state reason Server.SpotInstanceTermination, its host gone at once."""
    if not 0 <= notice <= 3600:
        raise SpecError(f"--notice {notice} must be between 0 and 3600 seconds")
    client = _client(endpoint)
    record = client.preempt(instance, notice)
    _say(f"{instance}: notice served, terminates at {record['terminate_at']}")
    if wait:
        client.wait_reclaimed(instance, notice + 60)
        _say(f"{instance}: reclaimed (Server.SpotInstanceTermination), host gone")


@sandbox_app.command("capacity")
def capacity(
    zones: Annotated[list[str], typer.Argument(help="availability zone(s)", show_default=False)],
    market: Annotated[str, typer.Option("--market", help="spot, on-demand or all")] = "spot",
    restore: Annotated[bool, typer.Option("--restore", help="give the capacity back")] = False,
    endpoint: EndpointOption = None,
) -> None:
    """Take away a zone's capacity (launches there get InsufficientInstanceCapacity)."""
    if market not in ("spot", "on-demand", "all"):
        raise SpecError(f"--market {market!r}: choose spot, on-demand or all")
    document = _client(endpoint).set_capacity(zones, market, available=restore)
    refused = document["refused"]
    if not refused:
        _say("every zone has capacity")
    for row in refused:
        _say(f"no {row['market']} capacity in {row['zone']}")


@sandbox_app.command("boot")
def boot(
    ssh_delay: Annotated[
        float,
        typer.Option("--ssh-delay", help="seconds from `running` until sshd starts (0: none)"),
    ] = 0.0,
    endpoint: EndpointOption = None,
) -> None:
    """How instances launched from now on boot: with --ssh-delay S they turn `running` S
    seconds before their sshd answers, as a slow image does on EC2 (default 0: `running` only
    once SSH answers)."""
    from orchestrator.sandbox.gateway import MAX_SSH_DELAY_S

    if not 0 <= ssh_delay <= MAX_SSH_DELAY_S:
        raise SpecError(f"--ssh-delay {ssh_delay} must be between 0 and {MAX_SSH_DELAY_S} seconds")
    document = _client(endpoint).set_boot(ssh_delay)
    delay = document["ssh_delay_s"]
    if delay:
        _say(f"new instances turn running {delay:g} s before their sshd answers")
    else:
        _say("new instances turn running once their sshd answers")
