"""`orch check`'s look at the local provider's needs, on this machine's real programs: a PATH
that lacks one of them makes that part missing, with its fix."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from orchestrator.config import LocalSettings, Settings
from orchestrator.errors import SpecError
from orchestrator.providers.check import check
from orchestrator.providers.local.prerequisites import linux, local_readiness

# The firewall's programs: with them `orch check` reads the host's firewall (without them, a
# host whose kernel holds a legacy iptables table gets a note that it cannot be read).
FIREWALL = ("iptables", "iptables-nft", "iptables-legacy", "nft")


def path_with(tmp_path: Path, *names: str) -> str:
    """A PATH holding only the real programs `names` (links to this machine's)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in names:
        found = shutil.which(name)
        assert found, f"{name} is part of this machine's set-up"
        (bin_dir / name).symlink_to(found)
    return str(bin_dir)


def parts(settings: Settings, path: str, euid: int = 0) -> dict[str, tuple[bool, bool]]:
    result = local_readiness(settings, path=path, euid=euid)
    return {item.name: (item.ok, item.needed) for item in result.requirements}


def test_every_part_there_is_ready(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path, local=LocalSettings(network="namespace"))
    path = path_with(tmp_path, "rsync", "ssh", "ip", *FIREWALL)
    result = local_readiness(settings, path=path, euid=0)
    assert result.ready and all(item.ok and not item.fix for item in result.requirements)
    assert [item.name for item in result.requirements] == [
        "Linux", "rsync", "ssh", "sshd", "root", "ip", "bridge traffic",
    ]  # fmt: skip


def test_a_path_without_rsync_is_not_ready_and_says_what_to_install(tmp_path: Path) -> None:
    path = path_with(tmp_path, "ssh", "ip", *FIREWALL)
    result = local_readiness(Settings(home=tmp_path), path=path, euid=0)
    assert not result.ready
    rsync = next(item for item in result.requirements if item.name == "rsync")
    assert not rsync.ok and rsync.needed and rsync.fix == "install rsync"
    assert [item.name for item in result.requirements if not item.ok] == ["rsync"]


def test_namespace_nodes_need_root_and_ip_only_when_asked_for(tmp_path: Path) -> None:
    path = path_with(tmp_path, "rsync", "ssh")  # no ip
    auto = Settings(home=tmp_path)
    # auto falls back on loopback nodes: a plain user without ip is ready, with notes.
    assert parts(auto, path, euid=1000) == {
        "Linux": (True, True), "rsync": (True, True), "ssh": (True, True),
        "sshd": (True, True), "root": (False, False), "ip": (False, False),
    }  # fmt: skip
    assert local_readiness(auto, path=path, euid=1000).ready
    namespace = Settings(home=tmp_path, local=LocalSettings(network="namespace"))
    result = local_readiness(namespace, path=path, euid=1000)
    assert not result.ready
    root = next(item for item in result.requirements if item.name == "root")
    assert "uid 1000" in root.detail and "ORCH_LOCAL_NETWORK=loopback" in root.fix
    loopback = Settings(home=tmp_path, local=LocalSettings(network="loopback"))
    assert set(parts(loopback, path, euid=1000)) == {"Linux", "rsync", "ssh", "sshd"}


def test_an_unknown_provider_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="unknown provider 'gcp'"):
        check("gcp", Settings(home=tmp_path))


def test_local_nodes_need_linux_and_say_so_elsewhere() -> None:
    assert linux("linux").ok
    mac = linux("darwin")
    assert not mac.ok and mac.needed and "runs on Linux only" in mac.detail
    assert "--provider aws" in mac.fix


def test_a_launch_off_linux_is_refused_before_any_node_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.errors import ProviderError
    from orchestrator.providers.base import LaunchRequest
    from orchestrator.providers.local.provider import LocalProvider

    monkeypatch.setattr("sys.platform", "darwin")
    provider = LocalProvider(Settings(home=tmp_path))
    request = LaunchRequest(job_id="j", cluster="j", count=1, gpus_per_node=1, public_key="k")
    with pytest.raises(ProviderError, match="runs on Linux only") as raised:
        provider.launch(request)
    assert "--provider aws" in (raised.value.hint or "")
    assert provider.list_owned() == []
