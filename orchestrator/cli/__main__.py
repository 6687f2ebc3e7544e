"""`python -m orchestrator.cli ...` is `orch ...`."""

from orchestrator.cli import main

main()
