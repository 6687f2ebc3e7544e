"""What a node says of a run that has not started making progress (pure): the command that
asks it, and the parser of its answer.

For a start that made no progress within `recovery.start_timeout`, the controller asks every
node (one command each): did torchrun start its workers (its rendezvous passed), does the run
still live, is the setup still running, which peers hold a connection to the master's port
(read on node 0: who reached the rendezvous), in what state this node's own connection to the
master is (SYN-SENT: its packets go unanswered), and the last lines of its log. What a node
answers is data: the parser keeps only fields of the expected types, bounded.
"""

from __future__ import annotations

import ipaddress
import json
import shlex
from dataclasses import dataclass

from orchestrator.node.launch import NodeLayout, home_expr

START_MARK = "@@orch-start@@"
TAIL_LINES = 6  # last lines of a node's log kept
LINE_CHARS = 300  # each cut to this
MAX_PEERS = 64
REPORT_MAX_OUTPUT = 64 * 1024
_SETUP_WORDS = ("running", "done", "unchanged", "failed")
_CONNECTION_STATES = ("established", "syn-sent")

# Runs on the node (any Python 3): argv = run folder, master address, master port.
_REPORT_SCRIPT = r"""
import json, os, socket, struct, sys
run, addr, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
def names(path):
    try:
        return os.listdir(path)[:64]
    except OSError:
        return []
ranks = os.path.join(run, "ranks")
workers = any(n.startswith("attempt_") for d in names(ranks) for n in names(os.path.join(ranks, d)))
try:
    with open(os.path.join(run, "pid")) as fh:
        with open("/proc/%d/stat" % int(fh.read().strip())) as st:
            alive = st.read().rsplit(")", 1)[1].split()[0] != "Z"
except (OSError, ValueError, IndexError):
    alive = False
try:
    with open(os.path.join(run, "node.log"), "rb") as fh:
        fh.seek(0, 2)
        fh.seek(max(0, fh.tell() - 65536))
        lines = fh.read().decode("utf-8", "replace").splitlines()
except OSError:
    lines = []
setup = None
for line in lines:
    if line.startswith("[orch] setup"):
        setup = line[len("[orch] setup"):].strip(" :").split(" ")[0]
def endpoint(text):
    host, _, hex_port = text.partition(":")
    if len(host) == 8:
        ip = socket.inet_ntop(socket.AF_INET, struct.pack("=I", int(host, 16)))
    else:
        words = [int(host[i:i + 8], 16) for i in range(0, 32, 8)]
        ip = socket.inet_ntop(socket.AF_INET6, struct.pack("=4I", *words))
    return (ip[7:] if ip.startswith("::ffff:") else ip), int(hex_port, 16)
peers, to_master = set(), None
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    try:
        with open(table) as fh:
            rows = fh.read().splitlines()[1:]
    except OSError:
        continue
    for row in rows:
        fields = row.split()
        try:
            local, remote, state = endpoint(fields[1]), endpoint(fields[2]), fields[3]
        except (IndexError, ValueError, OSError):
            continue
        if local[1] == port and state == "01" and remote[0] != addr:
            peers.add(remote[0])
        if remote == (addr, port) and state in ("01", "02") and to_master != "established":
            to_master = "established" if state == "01" else "syn-sent"
print(sys.argv[4] + " " + json.dumps({
    "workers": workers, "alive": alive, "setup": setup, "peers": sorted(peers)[:64],
    "to_master": to_master, "tail": [l[:300] for l in lines if l.strip()][-6:],
}))
"""


@dataclass(frozen=True)
class NodeStart:
    """One node's answer: how far its part of the start got."""

    workers: bool  # torchrun started its workers here: its rendezvous passed
    alive: bool  # the run still lives
    setup: str | None  # the last word of the setup: running, done, unchanged, failed
    peers: tuple[str, ...]  # addresses connected to the master's port here (node 0: who reached it)
    to_master: str | None  # this node's connection to the master: established, syn-sent, None
    tail: tuple[str, ...]  # the last lines of its log


def report_command(layout: NodeLayout, master_addr: str, master_port: int) -> str:
    """The command that prints a node's `NodeStart` as one marked JSON line."""
    argv = shlex.join(["python3", "-c", _REPORT_SCRIPT])
    args = shlex.join([master_addr, str(int(master_port)), START_MARK])
    return f"{argv} {home_expr(layout.run_dir)} {args}"


def parse_report(output: str) -> NodeStart | None:
    """The report in a node's output; None when there is none that reads as one."""
    for line in reversed(output.splitlines()):
        if not line.startswith(START_MARK + " "):
            continue
        try:
            doc = json.loads(line[len(START_MARK) + 1 :])
        except (ValueError, RecursionError):
            return None
        if not isinstance(doc, dict):
            return None
        return NodeStart(
            workers=doc.get("workers") is True,
            alive=doc.get("alive") is True,
            setup=doc.get("setup") if doc.get("setup") in _SETUP_WORDS else None,
            peers=tuple(_addresses(doc.get("peers"))),
            to_master=doc.get("to_master") if doc.get("to_master") in _CONNECTION_STATES else None,
            tail=tuple(str(text)[:LINE_CHARS] for text in _list(doc.get("tail"))[-TAIL_LINES:]),
        )
    return None


def _list(value: object) -> list[object]:
    return value if isinstance(value, list) else []


def _addresses(value: object) -> list[str]:
    found = []
    for item in _list(value)[:MAX_PEERS]:
        try:
            found.append(str(ipaddress.ip_address(str(item)[:64])))
        except ValueError:
            continue
    return found
