"""A key that signs guard leases as a controller does, for tests that feed a guard by hand."""

from __future__ import annotations

import base64
import json
import time

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from orchestrator.node import guard_seal


class LeaseKey:
    """An Ed25519 key pair: `public_line` goes in the guard's terms (`GuardTerms.lease_key`),
    `signed` makes a `lease.json` the guard accepts."""

    def __init__(self) -> None:
        self.private = Ed25519PrivateKey.generate()
        self._renewals = 0

    @property
    def public_line(self) -> str:
        return (
            self.private.public_key()
            .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
            .decode()
        )

    def sign(self, data: bytes) -> bytes:
        return self.private.sign(data)

    def signed(self, job_id: str, **fields: object) -> str:
        """A lease of `fields` (on the node's clock) for `job_id`, renewed now: each is newer
        than the one before, unless `fields` name their own `renewed_at`."""
        self._renewals += 1
        doc = {"job_id": job_id, "renewed_at": time.time() + self._renewals * 1e-3, **fields}
        signature = base64.b64encode(self.sign(guard_seal.canonical(doc))).decode()
        return json.dumps({**doc, "signature": signature})
