"""The namespace-host kit: what the local provider offers to other code that builds hosts the
way it builds its nodes (today the sandbox's EC2 hosts, `orchestrator.sandbox.hosts`).

A host is a network namespace with a real sshd in it, its processes carrying a marker in their
environment. This module is the public surface for that: code outside the local provider imports
these names from here, never from `net`, `host` or `provider`, so the local provider can change
its internals without breaking its users. The names keep the contracts documented where they
are defined.
"""

from __future__ import annotations

from orchestrator.providers.local.host import kill_all, pids_with_env, run_checked, sweep
from orchestrator.providers.local.net import (
    NODE_RESOLV_CONF,
    SYSTEM_PATH,
    SshdConfig,
    detached_argv,
    node_hosts_text,
    node_path,
    sshd_config_text,
)
from orchestrator.providers.ssh_banner import answers_ssh

__all__ = [
    # building a host's files (pure)
    "NODE_RESOLV_CONF", "SYSTEM_PATH", "SshdConfig", "node_hosts_text", "node_path",
    "sshd_config_text",
    # starting it, and knowing when it answers
    "answers_ssh", "detached_argv", "run_checked",
    # finding and ending its processes
    "kill_all", "pids_with_env", "sweep",
]  # fmt: skip
