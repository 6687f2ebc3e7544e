"""`orch ssh` and `orch ssh-config`: a person's own way onto a running cluster's nodes.

    orch ssh NAME|JOB [--node N] [-L LOCAL:HOST:REMOTE ...] [-- COMMAND ...]
    orch ssh-config NAME|JOB

`orch ssh` runs the system's `ssh` with the cluster's key and pinned host keys, in the
foreground; its exit status is the command's (255: ssh could not reach the node). COMMAND is
handed to the node's shell as OpenSSH hands it: its words joined by spaces. Registered on
the app by `orchestrator.cli.app`.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from typing import Annotated

import typer

from orchestrator.cli.context import load_settings, open_ledger
from orchestrator.cli.output import make_console
from orchestrator.errors import SpecError

__all__ = ["ssh_command", "ssh_config_command"]

NameArgument = Annotated[str, typer.Argument(help="cluster name or job id", show_default=False)]


def ssh_command(
    name: NameArgument,
    command: Annotated[
        list[str] | None,
        typer.Argument(
            help="command to run on the node (after --), read by its shell as ssh does: "
            "the words joined by spaces; none: a shell"
        ),
    ] = None,
    node: Annotated[int, typer.Option("--node", "-n", help="node rank (0 is the master)")] = 0,
    forward: Annotated[
        list[str] | None,
        typer.Option("-L", help="forward LOCAL:HOST:REMOTE, e.g. 6006:localhost:6006"),
    ] = None,
) -> None:
    """Open a shell on a node of a running cluster, or run one command there (its exit code is
    passed through); -L forwards a port, e.g. to TensorBoard on node 0. Uses the cluster's own
    key and pinned host keys: nothing is written into ~/.ssh.

    As with ssh, the words after -- are joined by spaces and read by the node's shell: `orch
    ssh dev -- ls -la` and `orch ssh dev -- 'hostname; ls'` both work, and an argument that
    holds spaces or shell characters needs quotes of its own for that shell."""
    from orchestrator.cli.on_host import lives_on_host

    if lives_on_host(name):  # the host holds the job's key: its orch ssh, through the host
        from orchestrator.cli.on_host import ssh_on_host

        raise typer.Exit(ssh_on_host(name, node, forward or [], command or []))
    from orchestrator.control.verbs.node_access import cluster_access, forwards

    tunnels = forwards(forward or [])
    if shutil.which("ssh") is None:
        raise SpecError(
            "orch ssh needs the OpenSSH client, and no `ssh` is on the PATH",
            hint="install it (Debian: apt-get install openssh-client)",
        )
    settings = load_settings()
    access = cluster_access(settings, open_ledger(settings), name)
    argv = access.ssh_argv(node, command=remote_command(command or []), forwards=tunnels)
    # Ctrl-C belongs to the remote shell or command while ssh runs, not to this process.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        code = subprocess.run(argv, check=False).returncode
    finally:
        signal.signal(signal.SIGINT, previous)
    if code == 255:
        make_console(stderr=True).print(
            f"ssh to node {node} of {access.name} ended with 255: the node could not be reached, "
            "or the command itself exited 255",
            highlight=False,
        )
    raise typer.Exit(code)


def remote_command(words: list[str]) -> str:
    """The command line `orch ssh NAME -- WORDS` hands the node's shell: the words joined by
    spaces, as OpenSSH's `ssh HOST WORDS` does ("" when there are none: a shell)."""
    return " ".join(words)


def ssh_config_command(name: NameArgument) -> None:
    """Print OpenSSH `Host` blocks for a running cluster's nodes (`orch-NAME-0`, ...), for your
    own tools: `orch ssh-config NAME >> ~/.ssh/config`, then `ssh orch-NAME-0`, scp or VS Code
    Remote. The blocks point at the cluster's key and pinned host keys under ORCH_HOME."""
    from orchestrator.control.verbs.node_access import cluster_access

    settings = load_settings()
    access = cluster_access(settings, open_ledger(settings), name)
    sys.stdout.write(access.ssh_config())
