"""What a local node runs to power itself off: the local provider's `terminate` of itself.

A node's guard calls this, as an EC2 node calls `shutdown -h now` (its instance set to
terminate on shutdown): every process of the node ends, its namespace and disk are removed,
and its record with them. What the guard decided (`decision.json`) is kept, with the time
billing stopped, in `ORCH_HOME/local/powered-off/<id>.json`, as EC2 keeps a terminated instance's
state reason: the provider's `self_ended` reads it. The command that starts this program is
`net.poweroff_command`.

    python -m orchestrator.providers.local.poweroff --home ORCH_HOME INSTANCE_ID
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from orchestrator.config import load_settings


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
