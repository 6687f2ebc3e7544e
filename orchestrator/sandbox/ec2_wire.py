"""EC2's query protocol, the little the sandbox gateway needs of it. Pure.

Requests are form-encoded (`Action=...&InstanceType.1=...&Filter.1.Name=...&Filter.1.Value.1=`),
signed with SigV4 (the region is in the Authorization header's credential scope). Responses are
XML in EC2's namespace; errors are `<Response><Errors><Error>` documents. Only what the gateway
answers itself is rendered here; everything else is moto's.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from decimal import Decimal
from urllib.parse import parse_qsl
from xml.etree import ElementTree
from xml.sax.saxutils import escape

EC2_XMLNS = "http://ec2.amazonaws.com/doc/2016-11-15/"
LINUX = "Linux/UNIX"  # the only product the sandbox prices

_SCOPE_RE = re.compile(r"Credential=[^/,\s]+/\d{8}/([a-z0-9-]+)/")


def request_params(body: bytes, query_string: str = "") -> dict[str, str]:
    """The flat parameters of a query-protocol request (query string and form body)."""
    params = dict(parse_qsl(query_string, keep_blank_values=True))
    params.update(parse_qsl(body.decode("utf-8", errors="replace"), keep_blank_values=True))
    return params


def list_param(params: Mapping[str, str], name: str) -> list[str]:
    """Members of a list parameter `name.1`, `name.2`, ... in order."""
    found: list[tuple[int, str]] = []
    prefix = name + "."
    for key, value in params.items():
        suffix = key[len(prefix) :] if key.startswith(prefix) else ""
        if suffix.isdigit():
            found.append((int(suffix), value))
    return [value for _, value in sorted(found)]


def filters(params: Mapping[str, str]) -> dict[str, list[str]]:
    """`Filter.N.Name` / `Filter.N.Value.M` as {name: [values]}."""
    found: dict[str, list[str]] = {}
    for key, name in params.items():
        match = re.fullmatch(r"Filter\.(\d+)\.Name", key)
        if match:
            found.setdefault(name, []).extend(list_param(params, f"Filter.{match[1]}.Value"))
    return found


def region_of(authorization: str | None, default: str) -> str:
    """The region a SigV4-signed request was signed for; `default` when unsigned."""
    match = _SCOPE_RE.search(authorization or "")
    return match[1] if match else default


def _document(action: str, body: str) -> bytes:
    request_id = uuid.uuid4()
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<{action}Response xmlns="{EC2_XMLNS}">'
        f"<requestId>{request_id}</requestId>{body}</{action}Response>"
    ).encode()


def _timestamp(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def spot_price_history_xml(records: Iterable[tuple[str, str, Decimal]], at: datetime) -> bytes:
    """A DescribeSpotPriceHistory answer: one Linux/UNIX price per (zone, type, price) record."""
    items = "".join(
        f"<item><availabilityZone>{escape(zone)}</availabilityZone>"
        f"<instanceType>{escape(itype)}</instanceType>"
        f"<productDescription>{LINUX}</productDescription>"
        f"<spotPrice>{price}</spotPrice><timestamp>{_timestamp(at)}</timestamp></item>"
        for zone, itype, price in records
    )
    return _document(
        "DescribeSpotPriceHistory", f"<spotPriceHistorySet>{items}</spotPriceHistorySet>"
    )


def instance_type_offerings_xml(rows: Iterable[tuple[str, str]], location_type: str) -> bytes:
    """A DescribeInstanceTypeOfferings answer from (instance type, location) rows."""
    items = "".join(
        f"<item><instanceType>{escape(itype)}</instanceType>"
        f"<locationType>{escape(location_type)}</locationType>"
        f"<location>{escape(location)}</location></item>"
        for itype, location in rows
    )
    return _document(
        "DescribeInstanceTypeOfferings",
        f"<instanceTypeOfferingSet>{items}</instanceTypeOfferingSet>",
    )


def error_xml(code: str, message: str) -> bytes:
    """An EC2 error document (botocore reads `Code` and `Message` from it)."""
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Response><Errors><Error><Code>{escape(code)}</Code>"
        f"<Message>{escape(message)}</Message></Error></Errors>"
        f"<RequestID>{uuid.uuid4()}</RequestID></Response>"
    ).encode()


def launched_instance_ids(run_instances_xml: bytes) -> list[str]:
    """Instance ids in a RunInstances answer (`instancesSet/item/instanceId`); [] if none."""
    try:
        root = ElementTree.fromstring(run_instances_xml)
    except ElementTree.ParseError:
        return []
    ids: list[str] = []
    for element in root.iter():
        if _local(element.tag) != "instancesSet":
            continue
        for item in element:
            for child in item:
                if _local(child.tag) == "instanceId" and child.text:
                    ids.append(child.text.strip())
    return ids


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]
