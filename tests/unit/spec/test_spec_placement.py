"""The placement fields of `resources` (instance_type, region, zone, image, ports): what they
take, how they are kept, and the one clean exit-2 line (field and line named) for each mistake."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.spec.loading import load_job
from tests.unit.spec_cases import MINIMAL, spec_error, write


def resources(project: Path, body: str):  # noqa: ANN201
    return load_job(write(project, MINIMAL + f"resources:\n{body}")).spec.resources


def test_one_value_or_a_list_each_kept_as_a_list(project: Path) -> None:
    r = resources(
        project,
        "  instance_type: g5.12xlarge\n  region: [us-east-1, us-west-2]\n"
        "  zone: us-west-2b\n  image: ami-0868a20f5a3bf9702\n  ports: [6006, '8000-8010', 9000]\n",
    )
    assert r.instance_type == ["g5.12xlarge"] and r.region == ["us-east-1", "us-west-2"]
    assert r.zone == ["us-west-2b"] and r.image == "ami-0868a20f5a3bf9702"
    assert r.ports == ["6006", "8000-8010", "9000"]


def test_an_image_may_be_a_name_pattern(project: Path) -> None:
    pattern = "Deep Learning OSS Nvidia Driver AMI GPU PyTorch 2.* (Ubuntu 22.04) *"
    assert resources(project, f"  image: '{pattern}'\n").image == pattern


def test_nothing_set_leaves_the_provider_its_choice(project: Path) -> None:
    r = load_job(write(project, MINIMAL)).spec.resources
    assert (r.instance_type, r.region, r.zone, r.image, r.ports) == (None, None, None, None, [])


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ("  instance_type: G5.xlarge\n", "resources.instance_type", "not an instance type"),
        ("  instance_type: [g5.xlarge, g5.xlarge]\n", "resources.instance_type", "twice"),
        ("  instance_type: []\n", "resources.instance_type", "or a list"),
        ("  region: us-east\n", "resources.region", "not a region"),
        ("  zone: us-east-1\n", "resources.zone", "not an availability zone"),
        ("  region: us-east-1\n  zone: us-west-2a\n", "resources", "not in region us-east-1"),
        ("  image: ami-12\n", "resources.image", "AMI id"),
        ("  image: 'x'\n", "resources.image", "name pattern"),
        ("  ports: [22]\n", "resources.ports", "orch's own SSH"),
        ("  ports: [20-30]\n", "resources.ports", "orch's own SSH"),
        ("  ports: [70000]\n", "resources.ports", "from 1 to 65535"),
        ("  ports: ['9-8']\n", "resources.ports", "low end first"),
        ("  ports: [http]\n", "resources.ports", "not a port"),
        ("  ports: [6006, 6006]\n", "resources.ports", "twice"),
    ],
)
def test_each_mistake_is_one_line_naming_the_field(
    project: Path, body: str, field: str, words: str
) -> None:
    message = spec_error(write(project, MINIMAL + f"resources:\n{body}"))
    assert f"{field} (line " in message and words in message, message
