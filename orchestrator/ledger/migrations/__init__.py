"""The ledger's schema migrations (Alembic), run by `orchestrator.ledger.migrate` on open.

    env.py                  how Alembic runs them: always on a connection orch hands it
    baseline.py             the schema as the first revision created it (frozen)
    versions/NNNN_*.py      one revision each; `HEAD` names the newest

A new revision: add `versions/NNNN_what.py` with `down_revision` the previous head, change the
models in `store.py` the same way, and set `HEAD` to it. The tests hold `HEAD` to the scripts
and the migrated schema to the models, on SQLite and on PostgreSQL.
"""

from __future__ import annotations

from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent  # Alembic's script_location
BASELINE = "0001"  # the revision that creates the schema of the ledgers made before migrations
HEAD = "0006"  # the newest revision: a ledger stamped with it is opened without any check
