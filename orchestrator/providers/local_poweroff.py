"""Forwarder: nodes started by an older orch run `python -m orchestrator.providers.local_poweroff`
from their guards; the program now lives in `orchestrator.providers.local.poweroff`."""

from orchestrator.providers.local.poweroff import main

if __name__ == "__main__":
    main()
