"""Finding a local node's processes, against a fake /proc tree."""

from __future__ import annotations

from pathlib import Path

from orchestrator.providers.local.host import (
    pid_alive,
    pid_runs,
    pids_with_marker,
    sshd_pids_on_port,
)

TCP_HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"  # noqa: E501


def fake_process(
    proc: Path, pid: int, cmdline: str, env: dict[str, str], state: str = "S", sockets: tuple = ()
) -> None:
    d = proc / str(pid)
    (d / "fd").mkdir(parents=True)
    (d / "cmdline").write_bytes(cmdline.replace(" ", "\0").encode() + b"\0")
    (d / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items()))
    (d / "stat").write_text(f"{pid} (x y) {state} 1 {pid} {pid} 0 -1")
    for n, inode in enumerate(sockets):
        (d / "fd" / str(n)).symlink_to(f"socket:[{inode}]")


def tcp_row(port: int, inode: int) -> str:
    return f"   0: 0100007F:{port:04X} 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 {inode} 1\n"  # noqa: E501


def test_marker_finds_exactly_the_nodes_processes(tmp_path: Path) -> None:
    fake_process(tmp_path, 10, "python train.py", {"ORCH_LOCAL_NODE": "l-0000000001"})
    fake_process(tmp_path, 11, "sleep 1000", {"A": "1", "ORCH_LOCAL_NODE": "l-0000000001"})
    fake_process(tmp_path, 12, "sleep 1000", {"ORCH_LOCAL_NODE": "l-00000000012"})  # longer id
    fake_process(tmp_path, 13, "bash", {"X": "ORCH_LOCAL_NODE=l-0000000001"})  # not the marker
    (tmp_path / "self").mkdir()
    assert pids_with_marker("l-0000000001", tmp_path) == {10, 11}


def test_a_zombie_is_not_running(tmp_path: Path) -> None:
    fake_process(tmp_path, 20, "sshd: /usr/sbin/sshd -D -f /n/sshd_config", {}, state="Z")
    fake_process(tmp_path, 21, "sshd: /usr/sbin/sshd -D -f /n/sshd_config", {})
    assert not pid_alive(20, tmp_path) and not pid_runs(20, "/n/sshd_config", tmp_path)
    assert pid_alive(21, tmp_path) and pid_runs(21, "/n/sshd_config", tmp_path)
    assert not pid_runs(21, "/other/sshd_config", tmp_path)
    assert not pid_alive(22, tmp_path)


def test_sshd_processes_are_found_by_their_port(tmp_path: Path) -> None:
    (tmp_path / "net").mkdir()
    rows = tcp_row(2222, 501) + tcp_row(2222, 502) + tcp_row(3333, 503)
    (tmp_path / "net" / "tcp").write_text(TCP_HEADER + rows)
    fake_process(tmp_path, 30, "sshd: /usr/sbin/sshd -D -f /n/cfg [listener]", {}, sockets=(501,))
    fake_process(tmp_path, 31, "sshd: root@notty", {}, sockets=(502,))
    fake_process(tmp_path, 32, "sshd: /usr/sbin/sshd -D -f /m/cfg [listener]", {}, sockets=(503,))
    fake_process(tmp_path, 33, "python client.py", {}, sockets=(502,))  # not an sshd
    assert sshd_pids_on_port(2222, tmp_path) == {30, 31}
    assert sshd_pids_on_port(4444, tmp_path) == set()
