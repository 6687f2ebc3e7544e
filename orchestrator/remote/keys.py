"""Per-cluster SSH identity and pinned host keys, kept under ORCH_HOME/keys/<cluster>/.

The directory is 0700 and the private key 0600. The key is generated in-process (no
ssh-keygen), so the private key never appears in any process's arguments.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from orchestrator.atomic import write_atomic


@dataclass(frozen=True)
class HostAddress:
    """Where and how to reach one host over SSH; `host_key` is the only key accepted."""

    name: str  # label for messages, e.g. "node 1 (l-3f9c1a-1)"
    host: str
    port: int
    user: str
    host_key: str  # "ssh-ed25519 AAAA..." as the provider reported it
    # The node's own home on a shared machine (absolute): every command and copy for it runs
    # with HOME set to it, in it. None: the login's home, as sshd gives it.
    home: str | None = None
    proxy_jump: str | None = None  # "user@addr[:port]": reached through that host (ssh -J)

    @property
    def known_hosts_name(self) -> str:
        return self.host if self.port == 22 else f"[{self.host}]:{self.port}"


@dataclass(frozen=True)
class Identity:
    """A cluster's key pair and the known_hosts file that pins its hosts."""

    private_key: Path
    public_key: str  # OpenSSH public key line
    known_hosts: Path
    control_dir: Path  # where ssh keeps this cluster's multiplexing sockets (0700)


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.chmod(path, 0o600)


def new_key_pair() -> tuple[str, str]:
    """A fresh ed25519 key pair, made in this process: (OpenSSH private key, unencrypted;
    public key line without a comment)."""
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    return private.decode(), public.decode()


def ensure_identity(directory: Path, comment: str) -> Identity:
    """Return the key pair in `directory`, creating the directory (0700) and key (0600) once."""
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    private_path = directory / "id_ed25519"
    public_path = directory / "id_ed25519.pub"
    if not private_path.exists():
        private, public = new_key_pair()
        _write_private(private_path, private.encode())
        public_path.write_text(f"{public} {comment}\n")
    known_hosts = directory / "known_hosts"
    known_hosts.touch(mode=0o600, exist_ok=True)
    return Identity(
        private_path, public_path.read_text().strip(), known_hosts, _control_dir(directory)
    )


def _control_dir(directory: Path) -> Path:
    """A short per-cluster directory for ssh control sockets.

    Unix socket paths are limited to ~100 bytes, too few under a deep ORCH_HOME, so the
    sockets live under the temp dir, in a folder named by a hash of the cluster's key dir.
    """
    digest = hashlib.sha256(str(directory.absolute()).encode()).hexdigest()[:12]
    path = Path(tempfile.gettempdir()) / f"orch-ssh-{os.getuid()}" / digest
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    os.chmod(path, 0o700)
    return path


def known_hosts_text(hosts: list[HostAddress]) -> str:
    """known_hosts lines pinning each host to the key its provider reported."""
    return "".join(f"{h.known_hosts_name} {h.host_key}\n" for h in hosts)


def pin_hosts(identity: Identity, hosts: list[HostAddress]) -> None:
    """Replace the cluster's known_hosts with exactly these hosts' keys."""
    write_known_hosts(identity.known_hosts, hosts)


def write_known_hosts(path: Path, hosts: list[HostAddress]) -> None:
    """Replace the known_hosts file `path` (0600) with exactly these hosts' keys, atomically;
    two processes writing it at once each write a whole file."""
    write_atomic(path, known_hosts_text(hosts), private=True)
