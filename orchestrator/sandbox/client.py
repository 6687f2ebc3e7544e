"""The control API of a running sandbox, as `orch sandbox ...` subcommands and tests use it.

Talks only to the sandbox endpoint, which is always on the loopback interface.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from ipaddress import ip_address
from typing import Any
from urllib.parse import urlsplit

from orchestrator.sandbox.errors import SandboxError
from orchestrator.sandbox.gateway import CONTROL_PREFIX


class SandboxClient:
    """Client of the sandbox at `endpoint` (its EC2 endpoint URL). No I/O until called."""

    def __init__(self, endpoint: str, *, timeout_s: float = 30.0) -> None:
        parts = urlsplit(endpoint)
        host = parts.hostname or ""
        try:
            loopback = host == "localhost" or ip_address(host).is_loopback
        except ValueError:
            loopback = False
        if parts.scheme != "http" or not loopback:
            raise SandboxError(
                f"{endpoint!r} is not a sandbox endpoint (http://127.0.0.1:PORT)",
                hint="pass the URL `orch sandbox aws` printed, or set ORCH_AWS_ENDPOINT_URL to it",
            )
        self.endpoint = endpoint.rstrip("/")
        self.timeout_s = timeout_s

    def _call(self, method: str, route: str, body: dict | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            self.endpoint + CONTROL_PREFIX + route,
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as reply:
                return json.loads(reply.read() or b"{}")
        except urllib.error.HTTPError as exc:
            try:
                message = json.loads(exc.read()).get("error", str(exc))
            except ValueError:
                message = str(exc)
            raise SandboxError(f"the sandbox refused: {message}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise SandboxError(
                f"no sandbox answers at {self.endpoint}: {exc}",
                hint="start one with `orch sandbox aws` (as root) and use the URL it prints",
            ) from None

    def status(self) -> dict:
        """Region, zones, subnets, prices, capacity refusals, hosts and reclaims."""
        return self._call("GET", "status")

    def set_capacity(self, zones: list[str], market: str, *, available: bool) -> dict:
        """Take away (or give back) capacity for `market` ("spot", "on-demand", "all")."""
        return self._call(
            "POST", "capacity", {"zones": zones, "market": market, "available": available}
        )

    def preempt(self, instance_id: str, notice_s: float) -> dict:
        """Start reclaiming a spot instance; returns the reclaim's record at once."""
        return self._call("POST", "preempt", {"instance_id": instance_id, "notice_s": notice_s})

    def set_boot(self, ssh_delay_s: float) -> dict:
        """Instances launched from now on turn `running` `ssh_delay_s` seconds before their
        sshd starts (0: the default, `running` once SSH answers)."""
        return self._call("POST", "boot", {"ssh_delay_s": ssh_delay_s})

    def wait_reclaimed(self, instance_id: str, timeout_s: float) -> dict:
        """Wait until the reclaim of `instance_id` is done; returns its record."""
        deadline = time.monotonic() + timeout_s
        while True:
            record = next(
                (r for r in self.status()["reclaims"] if r["instance_id"] == instance_id), None
            )
            if record is None:
                raise SandboxError(f"the sandbox is not reclaiming {instance_id}")
            if record["done"]:
                return record
            if time.monotonic() > deadline:
                raise SandboxError(f"{instance_id} was not reclaimed within {timeout_s:.0f} s")
            time.sleep(0.2)
