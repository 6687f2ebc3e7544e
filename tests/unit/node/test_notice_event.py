"""The guard's spot-notice watch against a real metadata endpoint on loopback, and the notice
file it appends to without following what job code puts in its place."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from orchestrator.node.guard_files import append_at, open_dir
from orchestrator.node.notice_event import NoticeWatch
from orchestrator.node.spot_notice import NOTICE_PATH, parse_poller_line
from tests.support.metadata_endpoint import endpoint

__all__ = ["endpoint"]  # the fixture, imported for pytest


def lines(home: Path) -> list[str]:
    return (home / NOTICE_PATH).read_text().splitlines()


def test_ready_then_one_notice_appended_to_the_nodes_file(
    tmp_path: Path, endpoint: tuple[str, Path]
) -> None:
    url, notice = endpoint
    home = tmp_path / "home"
    home.mkdir()
    watch = NoticeWatch(str(home), None, url, 1.0)
    watch.run(0.0)
    watch.run(1.0)
    assert lines(home) == ["ready"]
    notice.write_text('{"action": "terminate", "time": "2026-11-30T10:02:00Z"}')
    for at in (2.0, 3.0, 4.0):  # posted until the node is gone: said once
        watch.run(at)
    said = lines(home)
    assert said[0] == "ready" and len(said) == 2 and not watch.finished
    line = parse_poller_line(said[1])
    assert line.kind == "notice" and line.notice is not None and line.notice.action == "terminate"


def test_no_endpoint_is_unavailable_after_three_tries_and_the_watch_ends(tmp_path: Path) -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    watch = NoticeWatch(str(tmp_path), None, url, 1.0)
    for at in (0.0, 1.0):
        watch.run(at)
        assert not watch.finished and not (tmp_path / NOTICE_PATH).exists()
    watch.run(2.0)
    [said] = lines(tmp_path)
    assert parse_poller_line(said).kind == "unavailable" and watch.finished
    bare = NoticeWatch(str(tmp_path / "other"), None, None, 1.0)  # terms without an endpoint
    (tmp_path / "other").mkdir()
    bare.run(0.0)
    assert parse_poller_line(lines(tmp_path / "other")[0]).kind == "unavailable"
    assert bare.finished


def test_what_job_code_puts_in_the_files_place_is_replaced_never_written_through(
    tmp_path: Path,
) -> None:
    secret = tmp_path / "secret"
    secret.write_text("root's\n")
    folder = tmp_path / "node"
    folder.mkdir()
    fd = open_dir(str(folder))
    try:
        append_at(fd, "f", "a\n", "a\n")
        append_at(fd, "f", "b\n", "a\nb\n")
        assert (folder / "f").read_text() == "a\nb\n"  # appended in place
        (folder / "f").unlink()
        (folder / "f").symlink_to(secret)
        append_at(fd, "f", "c\n", "a\nb\nc\n")
        assert not (folder / "f").is_symlink() and (folder / "f").read_text() == "a\nb\nc\n"
        (folder / "f").unlink()
        os.link(secret, folder / "f")  # a hard link to another file
        append_at(fd, "f", "d\n", "whole\n")
        assert (folder / "f").read_text() == "whole\n"
        (folder / "f").unlink()
        os.mkfifo(folder / "f")  # nobody reads it: a write would block
        append_at(fd, "f", "e\n", "whole\n")
        assert (folder / "f").read_text() == "whole\n"
        append_at(fd, "f", "x" * 10, "full\n", limit=12)  # no room: replaced
        assert (folder / "f").read_text() == "full\n"
    finally:
        os.close(fd)
    assert secret.read_text() == "root's\n"
    assert os.listdir(folder) == ["f"]  # no temporary left
