"""A node metadata endpoint (`orchestrator.node.imds_server`) served on loopback in the test's
own process: the fixture yields its URL and the notice file it serves."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.node.imds_server import MetadataState, serve


@pytest.fixture
def endpoint(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    notice = tmp_path / "notice.json"
    server = serve("127.0.0.1", 0, MetadataState("l-abc", notice))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", notice
    server.shutdown()
    server.server_close()
