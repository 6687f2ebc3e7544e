"""The spec's `container` section: image references read the way container runtimes read
them, the run options, the registry login by secret name, and how `load_job` and a dry run
report them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from orchestrator.errors import SpecError
from orchestrator.spec.container import (
    ContainerSpec,
    ImageRef,
    RegistryLogin,
    parse_image_ref,
    parse_volume,
    size_bytes,
)
from orchestrator.spec.loading import load_job
from tests.support.in_process import isolated_home, run_main

SHA = "sha256:" + "0123456789abcdef" * 4
PASSWORD = "planted-registry-token-5e1f"


@pytest.mark.parametrize(
    ("text", "registry", "repository", "tag", "digest"),
    [
        ("ubuntu", None, "ubuntu", None, None),
        ("ubuntu:22.04", None, "ubuntu", "22.04", None),
        ("nvcr.io/nvidia/pytorch:24.05-py3", "nvcr.io", "nvidia/pytorch", "24.05-py3", None),
        ("reg.example:5000/team/train:1.4", "reg.example:5000", "team/train", "1.4", None),
        ("localhost:5000/a/b:t", "localhost:5000", "a/b", "t", None),
        ("localhost/a", "localhost", "a", None, None),
        ("10.0.0.1:5000/team/train:1.4", "10.0.0.1:5000", "team/train", "1.4", None),
        ("10.0.0.1/team/train", "10.0.0.1", "team/train", None, None),
        ("[::1]:5000/a:b", "[::1]:5000", "a", "b", None),
        ("Registry.Example/a", "Registry.Example", "a", None, None),  # a host, not a repository
        (f"pytorch/pytorch@{SHA}", None, "pytorch/pytorch", None, SHA),
        (f"a/b:t@{SHA}", None, "a/b", "t", SHA),
        ("a__b/c-d.e--f", None, "a__b/c-d.e--f", None, None),
        ("host:5000", None, "host", "5000", None),  # no '/': a repository and its tag
        ("a:" + "T" * 128, None, "a", "T" * 128, None),
    ],
)
def test_references_a_runtime_accepts_parse_into_their_parts(
    text: str, registry: str | None, repository: str, tag: str | None, digest: str | None
) -> None:
    ref = parse_image_ref(text)
    assert ref == ImageRef(registry, repository, tag, digest)
    assert str(ref) == text


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("Ubuntu", "invalid repository 'Ubuntu'"),
        ("nvcr.io/NVIDIA/pytorch", "invalid repository 'NVIDIA/pytorch'"),
        ("a:-bad", "invalid tag '-bad'"),
        ("a:.bad", "invalid tag '.bad'"),
        ("a:" + "x" * 129, "invalid tag"),
        ("a:tä", "invalid tag 'tä'"),  # the runtimes' tag letters are ASCII
        ("a/b:", "invalid tag ''"),
        ("a/b:c/d", "invalid tag 'c/d'"),
        ("a:b:c", "invalid repository 'a:b'"),
        ("host:port/a", "invalid registry 'host:port'"),
        ("-x.io/a", "invalid registry '-x.io'"),
        ("ex_ample.com/a", "invalid registry 'ex_ample.com'"),
        ("a//b", "invalid repository"),
        ("a___b", "invalid repository"),
        ("a-", "invalid repository"),
        ("a b", "invalid repository"),
        (" a", "invalid image"),
        ("a\n", "invalid image"),
        ("", "invalid image"),
        ("a@sha256:abc", "invalid image digest"),
        ("a@" + SHA.upper().replace("SHA", "sha"), "invalid image digest"),  # hex is lowercase
        ("a@" + SHA + "0", "invalid image digest"),  # sha256 is 64 digits exactly
        ("a@md5:" + "a" * 32, "invalid image digest"),  # no runtime verifies md5
        ("a:tag@", "invalid image digest"),
        ("r.io/" + "a" * 251, "image name"),  # registry and repository: 255 at most
    ],
)
def test_references_a_runtime_refuses_are_refused_saying_which_part(text: str, said: str) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(said)):
        parse_image_ref(text)


def test_the_longest_valid_reference_is_accepted() -> None:
    name = "r.io/" + "a" * 250
    digest = "sha512:" + "f" * 128
    text = f"{name}:{'t' * 128}@{digest}"
    assert parse_image_ref(text).digest == digest


@pytest.mark.parametrize(
    ("registry", "region"),
    [
        ("123456789012.dkr.ecr.us-east-1.amazonaws.com", "us-east-1"),
        ("123456789012.dkr.ecr-fips.us-gov-west-1.amazonaws.com", "us-gov-west-1"),
        ("123456789012.dkr.ecr.cn-north-1.amazonaws.com.cn", "cn-north-1"),
        ("12345.dkr.ecr.us-east-1.amazonaws.com", None),  # an account id is 12 digits
        ("123456789012.dkr.ecr.us-east-1.amazonaws.com.evil.io", None),
        ("public.ecr.aws", None),  # ECR Public: anonymous pulls, no node role
        (None, None),
    ],
)
def test_ecr_region_is_read_from_an_ecr_registry_only(
    registry: str | None, region: str | None
) -> None:
    assert ImageRef(registry, "team/train", "1", None).ecr_region == region


@pytest.mark.parametrize(
    ("text", "size"),
    [("16g", 16 << 30), ("16G", 16 << 30), ("512m", 512 << 20), ("64k", 64 << 10), ("100", 100)],
)
def test_sizes_read_in_powers_of_1024(text: str, size: int) -> None:
    assert size_bytes(text) == size


@pytest.mark.parametrize("text", ["16 g", " 16g", "1.5g", "16gb", "-1", "16t", "", "g"])
def test_sizes_a_runtime_may_not_read_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="invalid size"):
        size_bytes(text)


def test_volumes_parse_into_host_container_and_mode() -> None:
    assert parse_volume("/scratch:/scratch:ro") == ("/scratch", "/scratch", "ro")
    assert parse_volume("/a:/b") == ("/a", "/b", "rw")


@pytest.mark.parametrize(
    "text",
    ["/a", "/a:/b:z", "/a:/b:ro:x", "a:/b", "/a:b", "/a/../b:/c", "/a:/b,c", "/a\t:/b", "/:/"],
)
def test_volumes_a_runtime_would_misread_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_volume(text)


def test_devices_must_name_a_device_under_dev() -> None:
    ContainerSpec(image="a", devices=["/dev/infiniband", "/dev/nvidia0"])
    for bad in ["/dev/", "/dev", "/sys/x", "dev/x", "/dev/../etc", "/dev/a:rwm"]:
        with pytest.raises(ValueError):
            ContainerSpec(image="a", devices=[bad])


def test_a_registry_user_name_is_one_line_without_a_colon() -> None:
    assert RegistryLogin(username="$oauthtoken", password_secret="NGC").username == "$oauthtoken"
    for bad in ["", "a:b", "a\nb", "a\tb", "x" * 257]:
        with pytest.raises(ValueError):
            RegistryLogin(username=bad, password_secret="NGC")


def _write(tmp_path: Path, container: str, extra: str = "") -> Path:
    (tmp_path / "work").mkdir(exist_ok=True)
    path = tmp_path / "job.yaml"
    path.write_text(f"name: c\nworkdir: work\nrun: python train.py\ncontainer:\n{container}{extra}")
    return path


def _error(path: Path, environ: dict[str, str] | None = None) -> str:
    with pytest.raises(SpecError) as caught:
        load_job(path, environ=environ or {})
    return str(caught.value)


def test_load_job_names_each_bad_container_field_and_its_line(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "  image: reg.example:5000/Team/train:1\n"  # line 5
        "  pul: always\n"
        "  shm_size: 16 g\n"
        "  devices: [/dev/nvidia0, /sys/x]\n"  # line 8
        "  volumes:\n"
        "    - /data:/data:ro\n"
        "    - /a:b\n",  # line 11
    )
    said = _error(path)
    assert "container.image (line 5): invalid repository 'Team/train'" in said, said
    assert "unknown field `container.pul` (line 6); did you mean `pull`?" in said, said
    assert "container.shm_size (line 7): invalid size '16 g'" in said, said
    assert "container.devices[1] (line 8): device '/sys/x'" in said, said
    assert "container.volumes[1] (line 11): volume container path 'b'" in said, said


def test_a_password_secret_outside_secrets_is_reported_at_its_own_line(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "  image: reg.example:5000/team/train:1\n"
        "  credentials:\n"
        "    username: bot\n"
        "    password_secret: REGISTRY_TOKEN\n",  # line 8
        "secrets: {OTHER: x}\n",
    )
    said = _error(path)
    assert "container.credentials.password_secret (line 8): names REGISTRY_TOKEN" in said, said
    assert "secrets: {REGISTRY_TOKEN: null}" in said, said


def test_an_unset_registry_password_says_it_is_the_registry_s(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "  image: reg.example:5000/team/train:1\n"
        "  credentials: {username: bot, password_secret: REGISTRY_TOKEN}\n",
        "secrets: {REGISTRY_TOKEN: null}\n",  # line 7
    )
    said = _error(path)
    assert "secrets.REGISTRY_TOKEN (line 7): has no value and REGISTRY_TOKEN is not set" in said
    assert "the registry password of container.credentials" in said, said


def test_the_public_document_names_the_password_s_secret_never_its_value(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "  image: 123456789012.dkr.ecr.us-east-1.amazonaws.com/team/train:1\n"
        "  credentials: {username: AWS, password_secret: REGISTRY_TOKEN}\n",
        "secrets: {REGISTRY_TOKEN: null}\n",
    )
    spec = load_job(path, environ={"REGISTRY_TOKEN": PASSWORD}).spec
    assert spec.secrets["REGISTRY_TOKEN"] == PASSWORD  # the node needs it
    document = spec.public_document()
    assert PASSWORD not in json.dumps(document)
    assert document["container"]["credentials"] == {
        "username": "AWS",
        "password_secret": "REGISTRY_TOKEN",
    }
    assert spec.container is not None
    assert PASSWORD not in json.dumps(spec.container.plan_document())


@pytest.fixture
def dry_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("COLUMNS", "200")
    return isolated_home(tmp_path, monkeypatch)


def test_a_dry_run_shows_the_image_as_parsed_its_pull_and_its_login(
    tmp_path: Path, dry_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REGISTRY_TOKEN", PASSWORD)
    path = _write(
        tmp_path,
        "  image: 10.0.0.1:5000/team/train:1.4\n"
        "  pull: always\n"
        "  credentials: {username: bot, password_secret: REGISTRY_TOKEN}\n",
        "secrets: {REGISTRY_TOKEN: null}\n",
    )
    code, out, err = run_main(["submit", str(path), "--dry-run", "--json"])
    assert code == 0, out + err
    assert json.loads(out)["container"] == {
        "image": "10.0.0.1:5000/team/train:1.4",
        "registry": "10.0.0.1:5000",
        "repository": "team/train",
        "tag": "1.4",
        "digest": None,
        "pull": "always",
        "login": {"with": "secret", "username": "bot", "password_secret": "REGISTRY_TOKEN"},
    }
    assert PASSWORD not in out + err

    code, out, err = run_main(["submit", str(path), "--dry-run"])
    assert code == 0, out + err
    assert (
        "container 10.0.0.1:5000/team/train:1.4: registry 10.0.0.1:5000, repository "
        "team/train, tag 1.4" in out
    ), out
    assert "pull always: pulled before every start" in out, out
    assert "registry login: user bot, password from secret REGISTRY_TOKEN (value hidden)" in out
    assert PASSWORD not in out + err


def test_a_dry_run_says_an_ecr_image_logs_in_with_the_node_role(
    tmp_path: Path, dry_home: Path
) -> None:
    path = _write(tmp_path, f"  image: 123456789012.dkr.ecr.eu-west-1.amazonaws.com/t@{SHA}\n")
    code, out, err = run_main(["submit", str(path), "--dry-run", "--json"])
    assert code == 0, out + err
    shown = json.loads(out)["container"]
    assert shown["login"] == {"with": "node_role", "ecr_region": "eu-west-1"}
    assert (shown["tag"], shown["digest"], shown["pull"]) == (None, SHA, "missing")

    code, out, err = run_main(["submit", str(path), "--dry-run"])
    assert "registry login: the node's instance role (Amazon ECR in eu-west-1, on aws)" in out
    assert "pull missing: pulled only where a node lacks it (a kept cluster reuses it)" in out


def test_a_dry_run_of_a_docker_hub_image_names_the_default_registry_and_tag(
    tmp_path: Path, dry_home: Path
) -> None:
    path = _write(tmp_path, "  image: pytorch/pytorch\n")
    code, out, err = run_main(["submit", str(path), "--dry-run"])
    assert code == 0, out + err
    assert (
        "container pytorch/pytorch: registry Docker Hub (the default), repository "
        "pytorch/pytorch, tag latest (none given)" in out
    ), out
    assert "registry login: none" in out, out


def test_a_dry_run_fails_when_the_registry_password_is_unset(
    tmp_path: Path, dry_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("REGISTRY_TOKEN", raising=False)
    path = _write(
        tmp_path,
        "  image: 10.0.0.1:5000/team/train:1.4\n"
        "  credentials: {username: bot, password_secret: REGISTRY_TOKEN}\n",
        "secrets: {REGISTRY_TOKEN: null}\n",
    )
    code, out, err = run_main(["submit", str(path), "--dry-run"])
    assert code == 2, out + err
    assert "REGISTRY_TOKEN is not set in the submitting shell (the registry password" in err + out
