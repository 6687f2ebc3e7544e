"""Alembic revisions of the ledger (see `orchestrator.ledger.migrations`)."""
