"""The run engine: one job's state machine (`runner.py`) and the parts it drives: bring-up,
watching, recovery, kept clusters, the end."""
