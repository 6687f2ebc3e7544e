"""The seal on the guard's lease: only the controller that holds the job's key can renew it.

Part of the guard program (`orchestrator.node.guard`), in the node runtime beside it: standard
library only, Python 3.8 or newer. The controller signs each lease with the Ed25519 key it
reaches the job's nodes with (`ORCH_HOME/keys/<id>/`); the terms carry the public half
(`lease_key`), which is all a node ever holds. The guard verifies here (RFC 8032, in pure
Python: about 3 ms a lease), so job code that rewrites `lease.json` cannot lift its limits.
"""

import binascii
import hashlib
import json

# Signed before a lease's JSON, so that no signature the key makes for anything else verifies
# as a lease (an SSH login signs a length-prefixed session id first).
LEASE_CONTEXT = b"orch-guard-lease-v1\n"
LEASE_TIMES = ("renewed_at", "runtime_deadline", "lease_until")  # on the node's clock
LEASE_DURATIONS = ("idle_timeout_s", "autostop_s")

_P = 2**255 - 19
_L = 2**252 + 27742317777372353535851937790883648493
_D = -121665 * pow(121666, _P - 2, _P) % _P
_SQRT_M1 = pow(2, (_P - 1) // 4, _P)


def _add(a, b):
    e, f = (a[1] - a[0]) * (b[1] - b[0]) % _P, (a[1] + a[0]) * (b[1] + b[0]) % _P
    g, h = 2 * a[3] * b[3] * _D % _P, 2 * a[2] * b[2] % _P
    e, f, g, h = f - e, h - g, h + g, f + e
    return (e * f % _P, g * h % _P, f * g % _P, e * h % _P)


def _times(s, point):
    result = (0, 1, 1, 0)
    while s:
        if s & 1:
            result = _add(result, point)
        point = _add(point, point)
        s >>= 1
    return result


def _point(raw):
    y = int.from_bytes(raw, "little")
    sign, y = y >> 255, y & ((1 << 255) - 1)
    if y >= _P:
        return None
    x2 = (y * y - 1) * pow(_D * y * y + 1, _P - 2, _P) % _P
    x = pow(x2, (_P + 3) // 8, _P)
    if (x * x - x2) % _P:
        x = x * _SQRT_M1 % _P
    if (x * x - x2) % _P or (x == 0 and sign):
        return None
    if x & 1 != sign:
        x = _P - x
    return (x, y, 1, x * y % _P)


_BASE = _point((4 * pow(5, _P - 2, _P) % _P).to_bytes(32, "little"))


def ed25519_verify(public, message, signature):
    """Whether `signature` (64 bytes) is `public`'s (32 bytes) over `message`."""
    if len(public) != 32 or len(signature) != 64:
        return False
    a, r = _point(public), _point(signature[:32])
    s = int.from_bytes(signature[32:], "little")
    if a is None or r is None or s >= _L:
        return False
    digest = hashlib.sha512(signature[:32] + public + message).digest()
    left = _times(s, _BASE)
    right = _add(r, _times(int.from_bytes(digest, "little") % _L, a))
    return all((left[i] * right[2] - right[i] * left[2]) % _P == 0 for i in (0, 1))


def canonical(doc):
    """The bytes a lease's signature covers: its fields (all but `signature`) as compact JSON
    with sorted keys, after LEASE_CONTEXT."""
    return LEASE_CONTEXT + json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def lease_problem(doc, key, job_id):
    """Why the lease `doc` (its fields and `signature`) is not one the controller signed for
    job `job_id` with `key` (base64 of the raw Ed25519 public key); None when it is."""
    fields = dict(doc)
    signature = fields.pop("signature", None)
    if not key:
        return "the terms name no key to check it with"
    if not isinstance(signature, str):
        return "it is not signed"
    try:
        good = ed25519_verify(
            binascii.a2b_base64(key), canonical(fields), binascii.a2b_base64(signature)
        )
    except (binascii.Error, ValueError):
        good = False
    if not good:
        return "its signature does not verify"
    if fields.get("job_id") != job_id:
        return "it is another job's"
    for name in LEASE_TIMES + LEASE_DURATIONS:
        value = fields.get(name)
        if value is not None and (type(value) not in (int, float) or value != value):
            return f"its {name} is not a number"
    if not isinstance(fields.get("renewed_at"), (int, float)):
        return "it has no renewal time"
    return None
