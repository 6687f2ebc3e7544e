"""The dashboard's access rules as pure decisions: loopback or not, the Host header, the token
and its file, the form's origin."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from starlette.datastructures import URL
from starlette.requests import Request

from orchestrator.web.access import (
    COOKIE,
    Access,
    is_loopback,
    load_token,
    url_without_token,
)


def request(headers: dict[str, str], path: str = "/") -> Request:
    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    return Request({"type": "http", "method": "GET", "path": path, "query_string": b"",
                    "headers": raw})  # fmt: skip


@pytest.mark.parametrize(
    ("address", "loopback"),
    [("127.0.0.1", True), ("127.3.4.5", True), ("::1", True), ("[::1]", True),
     ("localhost", True), ("0.0.0.0", False), ("10.1.2.3", False), ("::", False),
     ("example.org", False), ("", False)],
)  # fmt: skip
def test_loopback_addresses_are_told_apart(address: str, loopback: bool) -> None:
    assert is_loopback(address) is loopback


def test_a_loopback_dashboard_answers_only_loopback_host_names() -> None:
    access = Access("127.0.0.1", 8765, None)
    assert access.allowed_host("127.0.0.1:8765")
    assert access.allowed_host("localhost:8765")
    assert access.allowed_host("[::1]:8765")
    # a name that resolves to 127.0.0.1 for an attacker's page (DNS rebinding) is refused
    assert not access.allowed_host("attacker.example:8765")
    assert not access.allowed_host("")


def test_a_token_dashboard_answers_any_host_name_but_only_with_the_token() -> None:
    access = Access("0.0.0.0", 8765, "t" * 43)
    assert access.allowed_host("gpu-box.lan:8765")
    assert not access.authorized(request({}))
    assert not access.authorized(request({"Authorization": "Bearer wrong"}))
    assert access.authorized(request({"Authorization": "Bearer " + "t" * 43}))
    assert access.authorized(request({"Cookie": f"{COOKIE}={'t' * 43}"}))
    assert not access.authorized(request({"Cookie": f"{COOKIE}={'t' * 42}"}))


def test_a_form_is_same_origin_only_when_its_origin_names_the_host_it_was_sent_to() -> None:
    access = Access("127.0.0.1", 8765, None)
    assert access.same_origin(request({"Host": "127.0.0.1:8765",
                                       "Origin": "http://127.0.0.1:8765"}))  # fmt: skip
    assert access.same_origin(request({"Host": "127.0.0.1:8765",
                                       "Referer": "http://127.0.0.1:8765/jobs/a"}))  # fmt: skip
    assert not access.same_origin(request({"Host": "127.0.0.1:8765",
                                           "Origin": "http://evil.example"}))  # fmt: skip
    assert not access.same_origin(request({"Host": "127.0.0.1:8765"}))


def test_the_token_leaves_the_address_it_came_in() -> None:
    assert url_without_token(URL("http://h:1/jobs/a?token=x&y=2")) == "/jobs/a?y=2"
    assert url_without_token(URL("http://h:1/?token=x")) == "/"
    assert url_without_token(URL("http://h:1//evil.example/?token=x")) == "/evil.example/"


def test_the_token_is_made_once_private_and_kept(tmp_path: Path) -> None:
    home = tmp_path / "orch"
    token = load_token(home)
    path = home / "dashboard-token"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(token) >= 32 and load_token(home) == token
    assert load_token(home, renew=True) != token


def test_a_token_others_can_read_or_a_link_is_replaced(tmp_path: Path) -> None:
    home = tmp_path / "orch"
    token = load_token(home)
    path = home / "dashboard-token"
    os.chmod(path, 0o644)
    replaced = load_token(home)
    assert replaced != token and stat.S_IMODE(path.stat().st_mode) == 0o600
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("x" * 40 + "\n")
    os.chmod(elsewhere, 0o600)
    path.unlink()
    path.symlink_to(elsewhere)
    assert load_token(home) != "x" * 40
    assert not path.is_symlink() and elsewhere.read_text() == "x" * 40 + "\n"
