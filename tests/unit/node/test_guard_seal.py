"""The seal on the guard's lease: only a lease the job's key signed, for this job and newer
than the one in force, changes the guard's limits.

The verifier is the guard's own (pure Python, on the node) checked against `cryptography`;
the guard runs here as on a node, against real files in a temporary home. Job code runs as
the login user, who owns `lease.json`: whatever it writes there, the limits stay.
"""

from __future__ import annotations

import base64
import json
import os
import stat
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from orchestrator.node import guard, guard_seal
from orchestrator.node.guard_protocol import raw_public_key
from tests.support.guard_keys import LeaseKey
from tests.unit.node.test_guard_program import Node

FAR = 4_000_000_000.0  # 2096: a limit job code would like


def raw(key: Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def test_the_guards_verifier_agrees_with_cryptography() -> None:
    for size in range(0, 300, 7):
        key = Ed25519PrivateKey.generate()
        message = os.urandom(size)
        signature = key.sign(message)
        assert guard_seal.ed25519_verify(raw(key), message, signature)
        assert not guard_seal.ed25519_verify(raw(key), message + b"x", signature)
        tampered = bytearray(signature)
        tampered[size % 64] ^= 1
        assert not guard_seal.ed25519_verify(raw(key), message, bytes(tampered))
        assert not guard_seal.ed25519_verify(raw(Ed25519PrivateKey.generate()), message, signature)
    key = Ed25519PrivateKey.generate()
    signature = key.sign(b"m")
    s = int.from_bytes(signature[32:], "little") + guard_seal._L  # the same s, not reduced
    assert not guard_seal.ed25519_verify(raw(key), b"m", signature[:32] + s.to_bytes(32, "little"))
    assert not guard_seal.ed25519_verify(raw(key), b"m", signature[:63])
    assert not guard_seal.ed25519_verify(raw(key)[:31], b"m", signature)
    assert not guard_seal.ed25519_verify(bytes(32), b"m", bytes(64))


def test_the_terms_carry_the_raw_public_half_of_the_key() -> None:
    key = LeaseKey()
    assert base64.b64decode(raw_public_key(key.public_line)) == raw(key.private)
    for wrong in ("ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQ== x", "ssh-ed25519 !!", "nothing"):
        with pytest.raises(ValueError):
            raw_public_key(wrong)


def guarded(tmp_path: Path) -> Node:
    """A training node whose boot terms stopped the run 30 s ago; no controller for a minute."""
    node = Node(tmp_path, runtime_deadline=datetime.fromtimestamp(time.time() - 30, UTC))
    node.training()
    node.heartbeat(age_s=60)
    return node


def test_job_code_that_rewrites_the_lease_does_not_lift_the_limit(tmp_path: Path) -> None:
    """What the login user can write to lease.json, in the format the guard reads, changes
    nothing: the limit is still due."""
    node = guarded(tmp_path)
    lifted = {"job_id": "j-1", "runtime_deadline": FAR, "lease_until": FAR}
    other_key = LeaseKey()
    attempts = [
        json.dumps({**lifted, "renewed_at": time.time()}),  # unsigned
        json.dumps({**lifted, "renewed_at": time.time(), "signature": "AAAA"}),
        other_key.signed("j-1", runtime_deadline=FAR, lease_until=FAR),  # another key
        node.key.signed("another-job", runtime_deadline=FAR, lease_until=FAR),
        "[]",
        "not json",
    ]
    for text in attempts:
        node.write_lease(text)
        assert node.guard.due(time.time())[0] == "max_runtime", text


def test_an_old_lease_put_back_does_not_replace_the_one_in_force(tmp_path: Path) -> None:
    node = guarded(tmp_path)
    now = time.time()
    node.lease(runtime_deadline=FAR, lease_until=FAR)  # the job once had a long lease
    old = (tmp_path / node.layout.lease).read_text()
    assert node.guard.due(now) is None
    node.lease(runtime_deadline=FAR, lease_until=now - 5)  # the budget ran out since
    assert node.guard.due(now)[0] == "budget"
    node.write_lease(old)
    assert node.guard.due(now)[0] == "budget"
    node.write_lease("garbage")  # then the one in force, written again: still in force
    node.lease(runtime_deadline=FAR, lease_until=now - 5)
    assert node.guard.due(now)[0] == "budget"


def test_a_refused_lease_is_logged_once_and_the_lease_in_force_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node = guarded(tmp_path)
    node.lease(runtime_deadline=FAR, lease_until=FAR)
    assert node.guard.due(time.time()) is None
    for renewal in range(3):
        node.write_lease(json.dumps({"job_id": "j-1", "renewed_at": time.time() + renewal}))
        assert node.guard.due(time.time()) is None
    said = [line for line in capsys.readouterr().out.splitlines() if "ignored" in line]
    assert len(said) == 1 and "guard/lease.json: it is not signed" in said[0]


def test_the_lease_in_force_outlives_a_restart_of_the_guard_in_its_own_folder(
    tmp_path: Path,
) -> None:
    """The guard keeps the last good lease in `state/` beside its terms (0700): a guard that
    starts again goes by it, whatever lease.json holds by then."""
    node = guarded(tmp_path)
    node.lease(runtime_deadline=FAR, lease_until=FAR)
    assert node.guard.due(time.time()) is None
    state = tmp_path / "state"
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    assert json.loads((state / "lease.json").read_text())["lease_until"] == FAR
    (tmp_path / node.layout.lease).unlink()
    again = guard.Guard(str(node.terms))
    assert again.lease() == node.guard.lease()
    assert again.due(time.time()) is None


def test_a_guard_without_a_lease_key_takes_no_lease(tmp_path: Path) -> None:
    node = guarded(tmp_path)
    terms = json.loads(node.terms.read_text())
    terms["lease_key"] = None
    node.terms.write_text(json.dumps(terms))
    node.guard = guard.Guard(str(node.terms))
    node.lease(runtime_deadline=FAR, lease_until=FAR)
    assert node.guard.due(time.time())[0] == "max_runtime"


def test_a_lease_nested_past_the_parsers_depth_is_refused_and_the_guard_goes_on(
    tmp_path: Path,
) -> None:
    node = guarded(tmp_path)
    node.lease(runtime_deadline=FAR, lease_until=FAR)
    in_force = node.guard.lease()
    assert in_force["lease_until"] == FAR
    node.write_lease("[" * 200_000)  # json.loads raises RecursionError on it, not ValueError
    assert node.guard.lease() == in_force
