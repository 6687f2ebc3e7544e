"""The sandbox's HTTP front: moto's EC2 API with prices and capacity, plus a control API.

EC2 calls pass through to moto, one at a time (moto is not thread-safe), except these,
answered as EC2 would for the sandbox's cloud:

- DescribeSpotPriceHistory, DescribeInstanceTypeOfferings (availability-zone): from the price
  table, i.e. every catalog type in every sandbox zone of the sandbox region, nothing elsewhere;
- RunInstances outside the region, or of a type the zone does not sell: `Unsupported` (400);
  in a (zone, market) without capacity: `InsufficientInstanceCapacity` (HTTP 500, as on AWS);
  a spot MaxPrice below the zone's price: `SpotMaxPriceTooLow` (400). Otherwise moto launches
  and the gateway reports the new ids (`Hooks.launched`) before answering.

`/_sandbox/...` is the control API (JSON): GET `/_sandbox/status`, POST `/_sandbox/capacity`
{zone, market, available}, POST `/_sandbox/preempt` {instance_id, notice_s}, POST
`/_sandbox/boot` {ssh_delay_s}. It serves on the same 127.0.0.1 port as the EC2 endpoint.
"""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any, Protocol

from orchestrator.errors import OrchError
from orchestrator.sandbox import ec2_wire as wire
from orchestrator.sandbox.capacity import Capacity
from orchestrator.sandbox.pricing import PriceTable

CONTROL_PREFIX = "/_sandbox/"
MAX_SSH_DELAY_S = 120  # a host being built holds its instance's end back that long
StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict, StartResponse], Iterable[bytes]]


class Hooks(Protocol):
    """What the gateway asks of the rest of the sandbox."""

    def zone_of_subnet(self, subnet_id: str) -> str | None: ...

    def launched(self, instance_ids: list[str]) -> None:
        """Instances moto just launched; must not raise (the launch happened)."""
        ...

    def status(self) -> dict: ...

    def preempt(self, instance_id: str, notice_s: float) -> dict: ...

    def boot(self, ssh_delay_s: float) -> dict: ...


class ControlError(OrchError):
    """A control request the sandbox refuses; `status` is the HTTP status to answer with."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class Gateway:
    """The WSGI application of the sandbox endpoint (see the module docstring)."""

    def __init__(
        self,
        inner: WsgiApp,
        *,
        prices: PriceTable,
        capacity: Capacity,
        hooks: Hooks,
        lock: AbstractContextManager[Any] | None = None,
    ) -> None:
        self.inner = inner
        self.prices = prices
        self.capacity = capacity
        self.hooks = hooks
        self.lock = lock if lock is not None else threading.RLock()  # held around moto
        self.priced_at = datetime.now(UTC)

    def __call__(self, environ: dict, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path.startswith(CONTROL_PREFIX):
            return self._control(environ, start_response, path[len(CONTROL_PREFIX) :])
        body = _read_body(environ)
        params = wire.request_params(body, environ.get("QUERY_STRING", ""))
        action = params.get("Action", "")
        region = wire.region_of(environ.get("HTTP_AUTHORIZATION"), self.prices.region)
        answer = self._answer(action, params, region)
        if answer is not None:
            status, document = answer
            return _respond(start_response, status, document, "text/xml")
        if action != "RunInstances":
            with self.lock:
                return list(self.inner(environ, start_response))
        with self.lock:
            return self._launch(environ, start_response)

    # --- EC2 --------------------------------------------------------------------------------

    def _answer(self, action: str, params: dict[str, str], region: str) -> tuple[int, bytes] | None:
        """The gateway's own answer to an EC2 call, or None to let moto answer it."""
        if action == "DescribeSpotPriceHistory":
            records = self._spot_records(params, region)
            return 200, wire.spot_price_history_xml(records, self.priced_at)
        if action == "DescribeInstanceTypeOfferings":
            location_type = params.get("LocationType", "region")
            if location_type not in ("availability-zone", "region"):
                return None
            rows = self._offerings(params, region, location_type)
            return 200, wire.instance_type_offerings_xml(rows, location_type)
        if action == "RunInstances":
            return self._refusal(params, region)
        return None

    def _spot_records(self, params: dict[str, str], region: str) -> list[tuple[str, str, Decimal]]:
        if region != self.prices.region:
            return []
        found = wire.filters(params)
        types = set(wire.list_param(params, "InstanceType")) | set(found.get("instance-type", []))
        zones = {params["AvailabilityZone"]} if params.get("AvailabilityZone") else set()
        zones |= set(found.get("availability-zone", []))
        products = set(wire.list_param(params, "ProductDescription"))
        products |= set(found.get("product-description", []))
        if products and not any(p.startswith(wire.LINUX) for p in products):
            return []
        return [
            (zone, itype, self.prices.spot[(zone, itype)])
            for itype, zone in self.prices.offerings()
            if (not types or itype in types) and (not zones or zone in zones)
        ]

    def _offerings(
        self, params: dict[str, str], region: str, location_type: str
    ) -> list[tuple[str, str]]:
        if region != self.prices.region:
            return []
        found = wire.filters(params)
        types = set(found.get("instance-type", []))
        locations = set(found.get("location", []))
        if location_type == "region":
            rows = [(itype, region) for itype in sorted(self.prices.on_demand)]
        else:
            rows = list(self.prices.offerings())
        return [
            (itype, where)
            for itype, where in rows
            if (not types or itype in types) and (not locations or where in locations)
        ]

    def _refusal(self, params: dict[str, str], region: str) -> tuple[int, bytes] | None:
        """Why EC2 would refuse this RunInstances, as (status, error document); None: launch."""
        itype = params.get("InstanceType", "m1.small")
        if region != self.prices.region:
            return 400, wire.error_xml(
                "Unsupported", f"The sandbox sells nothing in {region}; use {self.prices.region}."
            )
        zone = params.get("Placement.AvailabilityZone") or self.hooks.zone_of_subnet(
            params.get("SubnetId", "")
        )
        if zone is None:
            return None  # not in a sandbox subnet: moto decides
        spot = params.get("InstanceMarketOptions.MarketType") == "spot"
        market = "spot" if spot else "on-demand"
        price = self.prices.price(zone, itype, market)
        if price is None:
            return 400, wire.error_xml(
                "Unsupported",
                f"Your requested instance type ({itype}) is not supported in your requested"
                f" Availability Zone ({zone}).",
            )
        if self.capacity.refuses(zone, market):
            return 500, wire.error_xml(
                "InsufficientInstanceCapacity",
                f"We currently do not have sufficient {itype} capacity in the Availability Zone"
                f" you requested ({zone}). Our system will be working on provisioning additional"
                " capacity.",
            )
        max_price = params.get("InstanceMarketOptions.SpotOptions.MaxPrice")
        if spot and max_price and _below(max_price, price):
            return 400, wire.error_xml(
                "SpotMaxPriceTooLow",
                f"Your Spot request price of {max_price} is lower than the minimum required Spot"
                f" request fulfillment price of {price}.",
            )
        return None

    def _launch(self, environ: dict, start_response: StartResponse) -> Iterable[bytes]:
        """Let moto launch, then report the new instances before the caller sees them."""
        captured: dict[str, Any] = {}

        def capture(status: str, headers: list, exc_info: Any = None) -> Callable[[bytes], None]:
            captured["status"], captured["headers"] = status, headers
            return lambda _chunk: None

        answer = self.inner(environ, capture)
        try:
            body = b"".join(answer)
        finally:
            close = getattr(answer, "close", None)
            if close is not None:
                close()
        if captured.get("status", "").startswith("200"):
            self.hooks.launched(wire.launched_instance_ids(body))
        start_response(captured["status"], captured["headers"])
        return [body]

    # --- control API ------------------------------------------------------------------------

    def _control(self, environ: dict, start_response: StartResponse, route: str) -> Iterable[bytes]:
        method = environ.get("REQUEST_METHOD", "GET")
        try:
            if method == "GET" and route == "status":
                document: dict = self.hooks.status()
            elif method == "POST" and route == "capacity":
                request = _json_body(environ)
                zones = request.get("zones") or [request.get("zone")]
                unknown = [z for z in zones if z not in self.prices.zones]
                if unknown:
                    raise ControlError(
                        f"unknown zone(s) {unknown}; the sandbox's zones are "
                        f"{', '.join(self.prices.zones)}"
                    )
                try:
                    self.capacity.set(
                        zones, str(request.get("market", "spot")),
                        available=bool(request.get("available", False)),
                    )  # fmt: skip
                except ValueError as exc:
                    raise ControlError(str(exc)) from exc
                document = {"refused": self.capacity.refused()}
            elif method == "POST" and route == "preempt":
                request = _json_body(environ)
                notice_s = float(request.get("notice_s", 120))
                if not 0 <= notice_s <= 3600:
                    raise ControlError("notice_s must be between 0 and 3600 seconds")
                document = self.hooks.preempt(str(request.get("instance_id", "")), notice_s)
            elif method == "POST" and route == "boot":
                ssh_delay_s = float(_json_body(environ).get("ssh_delay_s", 0))
                if not 0 <= ssh_delay_s <= MAX_SSH_DELAY_S:
                    raise ControlError(
                        f"ssh_delay_s must be between 0 and {MAX_SSH_DELAY_S} seconds"
                    )
                document = self.hooks.boot(ssh_delay_s)
            else:
                raise ControlError(f"no control route {method} {CONTROL_PREFIX}{route}", 404)
        except ControlError as exc:
            return _respond(start_response, exc.status, _json({"error": exc.message}), "json")
        except (ValueError, TypeError) as exc:
            return _respond(start_response, 400, _json({"error": str(exc)}), "json")
        return _respond(start_response, 200, _json(document), "json")


def _below(max_price: str, price: Decimal) -> bool:
    try:
        return Decimal(max_price) < price
    except InvalidOperation:
        return False


def _read_body(environ: dict) -> bytes:
    """Read the request body and put it back, so the inner app can read it again."""
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    body = environ["wsgi.input"].read(length) if length > 0 else b""
    environ["wsgi.input"] = io.BytesIO(body)
    environ["CONTENT_LENGTH"] = str(len(body))
    return body


def _json_body(environ: dict) -> dict:
    try:
        document = json.loads(_read_body(environ) or b"{}")
    except ValueError as exc:
        raise ControlError(f"the request body is not JSON: {exc}") from exc
    if not isinstance(document, dict):
        raise ControlError("the request body must be a JSON object")
    return document


def _json(document: object) -> bytes:
    return (json.dumps(document, indent=1, default=str) + "\n").encode()


_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 409: "Conflict", 500: "Server Error"}


def _respond(start_response: StartResponse, status: int, body: bytes, kind: str) -> list[bytes]:
    content_type = "application/json" if kind == "json" else kind
    start_response(
        f"{status} {_REASONS.get(status, 'Error')}",
        [("Content-Type", content_type), ("Content-Length", str(len(body)))],
    )
    return [body]
