"""moto's S3 over HTTP where namespace nodes reach it: on this machine's address on a bridge of
the caller's own (made first when absent, so the server listens there before any node exists).

The local provider removes a bridge when its last node ends, and the server's address with it:
a port of its own (one end of a veth pair) holds it while the server runs, whatever nodes come
and go. After, the server stops, the pair goes, and the bridge goes once no node uses it."""

from __future__ import annotations

import logging
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from ipaddress import IPv4Network
from pathlib import Path

from orchestrator.config import LocalSettings, Settings
from orchestrator.providers.local import net
from orchestrator.providers.local.provider import LocalProvider


@contextmanager
def s3_on_bridge(bridge: str, subnet: IPv4Network) -> Iterator[tuple[str, int]]:
    """The server's endpoint URL and port, on `bridge`'s address in `subnet`."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # not a line per request

    made = subprocess.run(["ip", "link", "show", "dev", bridge], capture_output=True)
    if made.returncode != 0:
        for argv in net.bridge_create_argvs(bridge, subnet):
            subprocess.run(argv, check=True, capture_output=True)
    hold = f"{bridge[:13]}h"
    for argv in (
        ["ip", "link", "add", hold, "type", "veth", "peer", "name", f"{bridge[:13]}p"],
        ["ip", "link", "set", "dev", hold, "master", bridge],
        ["ip", "link", "set", "dev", hold, "up"],
    ):
        subprocess.run(argv, check=True, capture_output=True)
    address = str(net.bridge_address(subnet))
    server = ThreadedMotoServer(ip_address=address, port=0, verbose=False)
    server.start()
    port = server.get_host_and_port()[1]
    try:
        yield f"http://{address}:{port}", port
    finally:
        server.stop()
        subprocess.run(["ip", "link", "del", "dev", hold], check=False, capture_output=True)
        with tempfile.TemporaryDirectory(prefix="orch-bridge-cleanup-") as home:
            local = LocalSettings(bridge=bridge, subnet=subnet)
            LocalProvider(Settings(home=Path(home), local=local)).cleanup_network()
