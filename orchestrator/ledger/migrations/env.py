"""How Alembic runs the ledger's revisions: on the connection `orchestrator.ledger.migrate`
hands it (`config.attributes["connection"]`), inside that connection's transaction, which the
caller commits. There is no alembic.ini and no offline (SQL script) mode."""

from __future__ import annotations

from alembic import context
from sqlmodel import SQLModel

import orchestrator.ledger.store  # noqa: F401 - the models, for `target_metadata`

connection = context.config.attributes.get("connection")
if connection is None or context.is_offline_mode():
    raise RuntimeError(
        "the ledger's migrations run on open (orchestrator.ledger.migrate.upgrade), "
        "on a connection; not from the alembic command line"
    )
context.configure(
    connection=connection,
    target_metadata=SQLModel.metadata,
    render_as_batch=connection.dialect.name == "sqlite",  # SQLite alters tables by copying
)
with context.begin_transaction():
    context.run_migrations()
