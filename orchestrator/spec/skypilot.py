"""A SkyPilot task file read as an orch job spec (pure).

`orch submit task.yaml` takes a SkyPilot task unchanged when it uses the fields both tools
share. Its `run` starts its own processes once per node (SkyPilot's way), so the job gets
`launcher: none`, and the run sees SkyPilot's variables (`SKYPILOT_NODE_RANK`,
`SKYPILOT_NODE_IPS`, `SKYPILOT_NUM_NODES`, `SKYPILOT_NUM_GPUS_PER_NODE`) beside orch's.

    SkyPilot                          orch
    name, workdir, setup, run         the same (the name lower-cased, with '-' for other
                                      characters; by default the file's; workdir: .)
    num_nodes                         resources.nodes
    resources.accelerators: A10G:4    resources.accelerator: A10G, resources.gpus_per_node: 4
    resources.use_spot                resources.spot
    resources.disk_size               resources.disk_size_gb
    resources.instance_type, region,  resources.instance_type, region, zone, image, ports
      zone, image_id, ports
    resources.image_id: docker:REF    container.image: REF (an image_id without docker: is an AMI)
    envs/secrets SKYPILOT_DOCKER_*    container.credentials (see `_docker_login`)
    resources.cloud: aws, or          provider: aws (and resources.region, zone)
      infra: aws[/REGION[/ZONE]]
    envs                              env
    file_mounts: {/remote: ./local}   data: [{src: ./local, dst: /remote}]
    file_mounts: {/remote: s3://b/p}, data: [{src: s3://b/p, dst: /remote}] (MOUNT and
      or {source: s3://b/p, mode: M}    MOUNT_CACHED are copied too: `skypilot_notices`)

Every other SkyPilot field is refused by name (never ignored): a task that asks for, say, a
CPU count or a gs:// mount would otherwise run on something it did not ask for. orch's own
sections (budget, checkpoint, recovery, deadline, spot_policy) may be added to such a file.
"""

from __future__ import annotations

import re
from typing import Any

from orchestrator.spec.container import _looks_like_registry

Loc = tuple[str | int, ...]
Problem = tuple[Loc, str]  # where (in the task file), what is wrong

SKYPILOT_TOP = ("num_nodes", "envs", "file_mounts", "service", "config")
SKYPILOT_RESOURCES = ("accelerators", "use_spot", "disk_size", "cloud", "infra")
SHARED_TOP = ("name", "workdir", "setup", "run", "secrets")
ORCH_EXTRAS = (
    "budget", "checkpoint", "recovery", "deadline", "spot_policy", "provider", "container",
)  # fmt: skip
DOCKER = "docker:"  # SkyPilot's image_id prefix for a container image
USERNAME, PASSWORD, SERVER = (
    "SKYPILOT_DOCKER_USERNAME", "SKYPILOT_DOCKER_PASSWORD", "SKYPILOT_DOCKER_SERVER",
)  # fmt: skip
_DOCKER_HUB = ("docker.io", "index.docker.io", "registry-1.docker.io")
_CLOUDS = {"aws": "aws"}  # SkyPilot's cloud names that orch serves, to orch's providers
_ACCELERATOR = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.-]*)(?::(\d+))?$")
_NOT_HERE = "orch does not support this SkyPilot field"


def looks_like_skypilot(raw: dict[Any, Any]) -> bool:
    """Whether a spec file is written in SkyPilot's fields rather than orch's."""
    if any(key in raw for key in SKYPILOT_TOP):
        return True
    resources = raw.get("resources")
    if not isinstance(resources, dict):
        return False
    image_id = resources.get("image_id")  # docker:REF is SkyPilot's; an AMI id may be a typo
    docker = isinstance(image_id, str) and image_id.startswith(DOCKER)
    return docker or any(key in resources for key in SKYPILOT_RESOURCES)


def from_skypilot(raw: dict[Any, Any], default_name: str) -> tuple[dict[str, Any], list[Problem]]:
    """The orch spec a SkyPilot task means, and every field that cannot be taken (with its
    place in the task file). Values are checked further by orch's own spec."""
    problems: list[Problem] = []
    spec: dict[str, Any] = {"launcher": "none"}
    for key, value in raw.items():
        if key == "name" and isinstance(value, str):
            spec["name"] = _name(value)  # SkyPilot allows capitals and '_', orch's ids do not
        elif key in SHARED_TOP or key in ORCH_EXTRAS:
            spec[key] = value
        elif key == "num_nodes":
            spec.setdefault("resources", {})["nodes"] = value
        elif key == "envs":
            spec["env"] = _envs(_without_password(value), problems)
        elif key == "file_mounts":
            spec["data"] = _file_mounts(value, problems)
        elif key == "resources":
            _resources(value, spec, problems)
        else:
            problems.append(((str(key),), f"{_NOT_HERE}; {_HINTS.get(str(key), _SEE_DOCS)}"))
    _password_to_secrets(raw, spec)
    _docker_image(raw, spec, problems)
    spec.setdefault("name", _name(default_name))
    spec.setdefault("workdir", ".")
    return spec, problems


_SEE_DOCS = "docs/spec.md (SkyPilot task files) lists the fields orch takes"
_HINTS = {
    "env": "a SkyPilot task gives it as envs",
    "data": "a SkyPilot task gives it as file_mounts",
    "service": "orch runs training jobs, not services",
    "config": "orch's settings live in ORCH_HOME/config.yaml",
}


# orch's places of what a task file says, back to the task's own field names (for errors).
_BACK: dict[Loc, Loc] = {
    ("resources", "nodes"): ("num_nodes",),
    ("resources", "spot"): ("resources", "use_spot"),
    ("resources", "disk_size_gb"): ("resources", "disk_size"),
    ("resources", "accelerator"): ("resources", "accelerators"),
    ("resources", "gpus_per_node"): ("resources", "accelerators"),
    ("resources", "image"): ("resources", "image_id"),
    ("container", "image"): ("resources", "image_id"),
    ("env",): ("envs",),
    ("data",): ("file_mounts",),
}


def task_loc(loc: Loc) -> Loc:
    """Where in the task file an error found at orch's `loc` belongs (`resources.nodes` is
    the task's `num_nodes`); a place both share stays as it is."""
    for length in (2, 1):
        if loc[:length] in _BACK:
            back = _BACK[loc[:length]]
            return back if loc[0] == "data" else back + loc[length:]
    return loc


def _name(text: str) -> str:
    """A valid orch job name from a file name (`train_task.yaml` -> `train-task`)."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:63].strip("-")
    return name if name[:1].isalpha() else f"task-{name}".strip("-")[:63]


def _envs(value: object, problems: list[Problem]) -> object:
    if not isinstance(value, dict):
        return value  # orch's spec names the wrong shape
    for name, item in value.items():
        if item is None or item == "":
            problems.append(
                (
                    ("envs", str(name)),
                    "has no value: SkyPilot would take it from `--env`; "
                    "give it a value in the file",
                )  # fmt: skip
            )
    return {k: v for k, v in value.items() if v is not None and v != ""}


def _without_password(envs: object) -> object:
    if not isinstance(envs, dict):
        return envs
    return {k: v for k, v in envs.items() if k != PASSWORD}


def _password_to_secrets(raw: dict[Any, Any], spec: dict[str, Any]) -> None:
    """SKYPILOT_DOCKER_PASSWORD of `envs` goes to `secrets` (orch shows env values); a null
    value there is the submitting shell's variable, as SkyPilot's `--env NAME` gives it."""
    envs = raw.get("envs")
    if isinstance(envs, dict) and PASSWORD in envs:
        secrets = spec.setdefault("secrets", {})
        if isinstance(secrets, dict):
            secrets.setdefault(PASSWORD, envs[PASSWORD])


def _docker_image(raw: dict[Any, Any], spec: dict[str, Any], problems: list[Problem]) -> None:
    """`resources.image_id: docker:REF` as `container.image: REF`, with SkyPilot's login
    variables as `container.credentials`; any other image_id stays an AMI id."""
    resources = spec.get("resources")
    image_id = resources.get("image") if isinstance(resources, dict) else None
    if not isinstance(image_id, str) or not image_id.startswith(DOCKER):
        return
    del resources["image"]
    where: Loc = ("resources", "image_id")
    container = spec.setdefault("container", {})
    if not isinstance(container, dict) or "image" in container:
        problems.append((where, "give the image once: here or as container.image"))
        return
    image = image_id[len(DOCKER) :].strip()
    given = _login_values(raw)
    server = given.get(SERVER)
    if isinstance(server, str) and server:
        image = _on_server(image, server, problems)
    container["image"] = image
    login = _docker_login(given, spec, problems)
    if login is not None:
        container.setdefault("credentials", login)


def _login_values(raw: dict[Any, Any]) -> dict[str, object]:
    """SkyPilot's login variables as the task gives them (from `envs` or `secrets`)."""
    found: dict[str, object] = {}
    for section in ("envs", "secrets"):
        values = raw.get(section)
        for name in (USERNAME, PASSWORD, SERVER) if isinstance(values, dict) else ():
            if name in values:
                found[name] = values[name]
    return found


def _on_server(image: str, server: str, problems: list[Problem]) -> str:
    """The image on SKYPILOT_DOCKER_SERVER: SkyPilot pulls a reference without a registry
    from that server (`docker:team/train:1` with an ECR server)."""
    host = server.split("://", 1)[-1].split("/", 1)[0]
    first, slash, _ = image.partition("/")
    if not (slash and _looks_like_registry(first)):
        return image if host in _DOCKER_HUB else f"{host}/{image}"
    if first != host and not (first in _DOCKER_HUB and host in _DOCKER_HUB):
        problems.append(
            (
                ("resources", "image_id"),
                f"the image is in {first}, but {SERVER} names {host}: the login would be "
                "for another registry; give the image's own registry",
            )  # fmt: skip
        )
    return image


def _docker_login(
    given: dict[str, object], spec: dict[str, Any], problems: list[Problem]
) -> dict[str, str] | None:
    """SkyPilot's SKYPILOT_DOCKER_USERNAME and SKYPILOT_DOCKER_PASSWORD as orch's login: the
    user name as written, the password by its secret's name (its value never in the spec).
    The user name must be written in the file: orch keeps it in the spec, where a value from
    the shell cannot be."""
    if USERNAME not in given and PASSWORD not in given:
        return None
    if USERNAME not in given or PASSWORD not in given:
        missing = PASSWORD if USERNAME in given else USERNAME
        problems.append(
            (("envs",), f"SkyPilot logs in with {USERNAME} and {PASSWORD}: give {missing} too")
        )
        return None
    username = given[USERNAME]
    if not isinstance(username, str) or not username:
        problems.append(
            (
                ("envs", USERNAME),
                "write the registry user in the file (envs: {"
                f"{USERNAME}: NAME}}); the password alone comes from the shell",
            )  # fmt: skip
        )
        return None
    secrets = spec.setdefault("secrets", {})
    if isinstance(secrets, dict):
        secrets.setdefault(PASSWORD, None)
    return {"username": username, "password_secret": PASSWORD}


_MODES = ("COPY", "MOUNT", "MOUNT_CACHED")  # SkyPilot's file_mounts modes, all copied by orch
_MOUNT_KEYS = ("source", "mode")


def _file_mounts(value: object, problems: list[Problem]) -> list[dict[str, object]]:
    """`file_mounts` as `data`: a local path or an s3:// source (plain, or `{source, mode}`)
    copied to every node; any other remote source, and a bucket SkyPilot would create or
    fill (`name`, `store`), is refused by its place."""
    if not isinstance(value, dict):
        problems.append((("file_mounts",), "must map node paths to local paths or s3:// URLs"))
        return []
    mounts = []
    for dst, item in value.items():
        where: Loc = ("file_mounts", str(dst))
        source = _mount_source(item, where, problems)
        if source is not None:
            mounts.append({"src": source, "dst": str(dst)})
    return mounts


def _mount_source(item: object, where: Loc, problems: list[Problem]) -> str | None:
    if isinstance(item, dict):
        extra = sorted(str(k) for k in item if k not in _MOUNT_KEYS)
        mode = str(item.get("mode", "COPY")).upper()
        if extra:
            problems.append(
                (where, f"{_NOT_HERE}: {', '.join(extra)} (orch creates no bucket and uploads "
                 "nothing to one); give an existing bucket as {source: s3://bucket/prefix}")
            )  # fmt: skip
            return None
        if mode not in _MODES:
            problems.append((where, f"unknown mode {item.get('mode')!r}: {', '.join(_MODES)}"))
            return None
        item = item.get("source")
    if not isinstance(item, str) or not item:
        problems.append((where, "give a local path or an s3://bucket/prefix as its source"))
        return None
    if "://" in item and not item.startswith("s3://"):
        scheme = item.split("://", 1)[0]
        problems.append(
            (where, f"{scheme}:// sources are not supported: orch reads s3:// buckets and local "
             "paths (copy the data to S3 first)")
        )  # fmt: skip
        return None
    return item


def skypilot_notices(raw: dict[Any, Any]) -> list[str]:
    """What a SkyPilot task asks that orch does its own way, for the user to read: a bucket
    mounted (MOUNT, MOUNT_CACHED) is copied to every node before the run instead."""
    mounts = raw.get("file_mounts")
    notices = []
    for dst, item in mounts.items() if isinstance(mounts, dict) else ():
        mode = str(item.get("mode", "COPY")).upper() if isinstance(item, dict) else "COPY"
        if mode in ("MOUNT", "MOUNT_CACHED"):
            notices.append(
                f"file_mounts.{dst}: orch copies {item.get('source')} to every node before the "
                f"run instead of mounting it ({mode}): the job starts once the copy is whole, "
                "and a kept cluster's nodes download only what changed for the next job"
            )
    return notices


def _resources(value: object, spec: dict[str, Any], problems: list[Problem]) -> None:
    if not isinstance(value, dict):
        problems.append((("resources",), "must be a mapping of SkyPilot resource fields"))
        return
    resources = spec.setdefault("resources", {})
    for key, item in value.items():
        where: Loc = ("resources", str(key))
        if key == "accelerators":
            _accelerators(item, resources, problems)
        elif key == "use_spot":
            resources["spot"] = item
        elif key == "disk_size":
            resources["disk_size_gb"] = item
        elif key in _SAME_PLACE:
            resources[_SAME_PLACE[key]] = item
        elif key in ("cloud", "infra"):
            cloud, *place = str(item).split("/")
            if cloud.lower() not in _CLOUDS or len(place) > 2:
                problems.append((where, f"{item!r}: orch runs on aws (or its local provider)"))
                continue
            spec["provider"] = _CLOUDS[cloud.lower()]
            for field, value in zip(("region", "zone"), place, strict=False):
                resources[field] = value  # infra: aws/REGION[/ZONE]
        else:
            problems.append((where, f"{_NOT_HERE}; {_SEE_DOCS}"))


_SAME_PLACE = {  # SkyPilot resource fields that mean what an orch resource field means
    "instance_type": "instance_type",
    "region": "region",
    "zone": "zone",
    "image_id": "image",
    "ports": "ports",
}


def _accelerators(item: object, resources: dict[str, Any], problems: list[Problem]) -> None:
    where: Loc = ("resources", "accelerators")
    if isinstance(item, dict) and len(item) == 1:
        ((name, count),) = item.items()
        item = f"{name}:{count}"
    match = _ACCELERATOR.match(item) if isinstance(item, str) else None
    if match is None:
        problems.append(
            (
                where,
                f"{item!r}: give one accelerator as NAME or NAME:COUNT, e.g. A10G:4 "
                "(orch does not choose among several)",
            )  # fmt: skip
        )
        return
    resources["accelerator"] = match.group(1)
    resources["gpus_per_node"] = int(match.group(2) or 1)
