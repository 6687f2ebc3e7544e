"""What a local node runs to power itself off: the local provider's `terminate` of itself.

A node's guard calls this, as an EC2 node calls `shutdown -h now` (its instance set to
terminate on shutdown): every process of the node ends, its namespace and disk are removed,
and its record with them. What the guard decided (`decision.json`) is kept, with the time
billing stopped, in `ORCH_HOME/local/powered-off/<id>.json`, as EC2 keeps a terminated instance's
state reason: the provider's `self_ended` reads it.

    python -m orchestrator.providers.local.poweroff --home ORCH_HOME INSTANCE_ID
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from orchestrator.config import load_settings
from orchestrator.providers.local.net import NODE_MARKER


def poweroff_command(home: Path, instance_id: str) -> str:
    """The node's poweroff command: run detached, without the node's marker in its
    environment, so that it is not among the processes it ends."""
    argv = [sys.executable, "-m", "orchestrator.providers.local.poweroff", "--home", str(home),
            instance_id]  # fmt: skip
    package_root = str(Path(__file__).resolve().parents[3])
    log = shlex.quote(str(home / "local" / "poweroff.log"))
    return (
        f"env -u {NODE_MARKER} PYTHONPATH={shlex.quote(package_root)} setsid "
        f"{shlex.join(argv)} >> {log} 2>&1 < /dev/null &"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", type=Path, required=True)
    parser.add_argument("instance_id")
    args = parser.parse_args(argv)
    from orchestrator.providers.local.provider import LocalProvider

    settings = load_settings({**os.environ, "ORCH_HOME": str(args.home)})
    print(f"powering off local node {args.instance_id}", flush=True)
    provider = LocalProvider(settings)
    decision = provider.guard_decision(args.instance_id)
    stopped = provider.terminate([args.instance_id])
    provider.record_self_end(args.instance_id, stopped, decision)
    print(f"local node {args.instance_id} is off", flush=True)


if __name__ == "__main__":
    main()
