"""The local provider reads a powered-off node's guard decision from the node's disk, which its
job's code could write: never through a link, never more than a bound."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.config import LocalSettings, Settings
from orchestrator.node import guard
from orchestrator.providers.local.provider import DECISION_CHARS, LocalProvider

NODE = "l-0123456789"


def guard_folder(provider: LocalProvider, job: str = "j-1") -> Path:
    folder = provider.store.node_dir(NODE) / "disk" / "orch-jobs" / job / "guard"
    folder.mkdir(parents=True)
    return folder


def provider_in(tmp_path: Path) -> LocalProvider:
    return LocalProvider(Settings(home=tmp_path / "orch", local=LocalSettings(network="loopback")))


def test_the_decision_is_read_and_its_fields_are_cut(tmp_path: Path) -> None:
    provider = provider_in(tmp_path)
    decision = {"kind": "max_runtime", "message": "x" * 100_000}
    (guard_folder(provider) / guard.DECISION).write_text(json.dumps(decision))
    read = provider.guard_decision(NODE)
    assert read["kind"] == "max_runtime" and read["message"] == "x" * DECISION_CHARS


def test_a_decision_behind_a_link_is_not_followed(tmp_path: Path) -> None:
    provider = provider_in(tmp_path)
    elsewhere = tmp_path / "elsewhere.json"  # a file of the user's, say
    elsewhere.write_text(json.dumps({"kind": "secret", "message": "the user's file"}))
    (guard_folder(provider) / guard.DECISION).symlink_to(elsewhere)
    linked_folder = provider.store.node_dir(NODE) / "disk" / "orch-jobs" / "j-2"
    linked_folder.mkdir()
    (linked_folder / "guard").symlink_to(tmp_path)  # a whole folder swapped for a link
    (tmp_path / guard.DECISION).write_text(json.dumps({"kind": "secret", "message": "no"}))
    assert provider.guard_decision(NODE) == {}


def test_a_decision_that_is_no_json_object_is_none(tmp_path: Path) -> None:
    provider = provider_in(tmp_path)
    (guard_folder(provider) / guard.DECISION).write_text("[" * 200_000)
    assert provider.guard_decision(NODE) == {}
