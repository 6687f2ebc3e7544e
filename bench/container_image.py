"""The 2 GB image of the container benchmark, built offline and pushed once.

The image is the test image's rootfs (Debian packages, `tests.support.containers.offline_image`)
plus one layer of incompressible data (random bytes), so that its size on the wire is its size
on disk: about `random_mb` + 56 MiB to pull, `random_mb` + 161 MiB unpacked. Both inputs are
cached under ~/.cache/orch-test-images (the rootfs tar, the random layer's tar) and so is the
registry's storage with the pushed image (`registry_storage`): a later run finds the image in
the registry and pushes nothing. Building and pushing happen in a throwaway podman store with
the product's podman settings, in a mount namespace of their own.

Measured here (2 cores, shared): the 1900 MiB random layer written in 8 s; importing, building
and pushing the image (gzip: 1.9 GB compressed) 58 s; a run that finds both cached, 0 s.
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from orchestrator.providers.local.containers import (
    podman_command,
    prepare_script,
    remove_leftover_cgroups,
)
from tests.support.containers import IMAGE_CACHE, OfflineImage, Registry

RANDOM_FILE = "opt/orch-bench/random.bin"
CHUNK = 1 << 20


@dataclass(frozen=True)
class BigImage:
    """The benchmark's image in the registry, and what making it cost in this run."""

    ref: str
    layer_s: float  # writing the random layer's tar (0.0: cached)
    push_s: float  # import, build and push (0.0: the registry had it)


def registry_storage(random_mb: int) -> Path:
    """Where the registry of the benchmark keeps its images between runs."""
    return IMAGE_CACHE / f"bench-registry-{random_mb}m"


def random_layer(random_mb: int, cache: Path = IMAGE_CACHE) -> tuple[Path, float]:
    """(a tar holding one file of `random_mb` MiB of random bytes, seconds spent making it)."""
    path = cache / f"bench-random-{random_mb}m.tar"
    if path.exists():
        return path, 0.0
    started = time.monotonic()
    cache.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    data = partial.with_suffix(".bin")
    try:
        with data.open("wb") as out:
            for _ in range(random_mb):
                out.write(os.urandom(CHUNK))
        with tarfile.open(partial, "w", format=tarfile.PAX_FORMAT) as tar:
            tar.add(data, arcname=RANDOM_FILE)
        partial.replace(path)
    finally:
        data.unlink(missing_ok=True)
        partial.unlink(missing_ok=True)
    return path, time.monotonic() - started


def has_manifest(registry: Registry, repository: str, tag: str) -> bool:
    """Whether `registry` serves `repository:tag`."""
    request = urllib.request.Request(
        f"http://{registry.address}/v2/{repository}/manifests/{tag}", method="HEAD"
    )
    token = base64.b64encode(f"{registry.user}:{registry.password}".encode()).decode()
    request.add_header("Authorization", f"Basic {token}")
    request.add_header(
        "Accept",
        "application/vnd.docker.distribution.manifest.v2+json, "
        "application/vnd.oci.image.manifest.v1+json",
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status == 200
    except urllib.error.HTTPError:
        return False


def big_image(registry: Registry, base: OfflineImage, random_mb: int) -> BigImage:
    """The benchmark's image in `registry` (pushed unless there): `base` + the random layer."""
    repository, tag = "bench/big", f"{base.key}-r{random_mb}m"
    ref = f"{registry.address}/{repository}:{tag}"
    layer, layer_s = random_layer(random_mb)
    if has_manifest(registry, repository, tag):
        return BigImage(ref, layer_s, 0.0)
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="orchbb-", dir="/tmp"))  # short: podman's runroot
    context = work / "context"
    context.mkdir()
    os.link(layer, context / "random.tar")  # same file system: no copy
    (context / "Containerfile").write_text("FROM localhost/bench-base:latest\nADD random.tar /\n")
    podman = podman_command(str(work / "pm")).replace(
        "--storage-driver overlay", "--storage-driver vfs"
    )
    script = (
        f"{prepare_script(Path('/proc/self/mounts').read_text(), str(work / 'pm'))} && "
        f"{podman} login --tls-verify=false --password-stdin -u {registry.user} "
        f"{registry.address} && "
        f"{podman} import --change 'CMD [\"/bin/sh\"]' {base.rootfs} "
        "localhost/bench-base:latest >/dev/null && "
        f"{podman} build --quiet --network none -t {ref} {context} >/dev/null && "
        f"{podman} push --tls-verify=false --quiet {ref}; rc=$?; "
        f"{podman} system reset --force; exit $rc"
    )
    out = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script],
        input=registry.password, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    shutil.rmtree(work, ignore_errors=True)
    remove_leftover_cgroups()
    if out.returncode != 0:
        raise RuntimeError(f"push of {ref} failed:\n{out.stdout}\n{out.stderr}")
    return BigImage(ref, layer_s, time.monotonic() - started)
