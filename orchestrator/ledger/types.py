"""Column types of the ledger that keep values exact on every database it runs on.

The same SQLModel models serve SQLite and PostgreSQL; these types decide the storage per
database, and read back the very values that were written:

- `UTCDateTime`: aware UTC datetimes. SQLite has no time zone type, so there they are ISO-8601
  text (as every ledger has stored them); PostgreSQL keeps them as `timestamptz`. Both read
  back as aware datetimes in UTC, to the microsecond.
- `DecimalText`: money and other exact decimals, never through a float. SQLite stores the
  decimal's text (`str(Decimal)`, as every ledger has); PostgreSQL an unconstrained `numeric`,
  which keeps the digits and the scale it was given ("0.50" reads back as Decimal("0.50")).

The migrations use these types too (`orchestrator.ledger.migrations.baseline`), so a table
created by a migration and one created from the models are the same.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import Numeric, String
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TIMESTAMP, TypeDecorator, TypeEngine

POSTGRESQL = "postgresql"


class UTCDateTime(TypeDecorator):
    """Aware UTC datetimes: ISO-8601 text on SQLite, `timestamptz` on PostgreSQL."""

    impl = String
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == POSTGRESQL:
            return dialect.type_descriptor(TIMESTAMP(timezone=True))
        return dialect.type_descriptor(String())

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> str | datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("the ledger stores aware UTC datetimes only")
        if dialect.name == POSTGRESQL:
            return value.astimezone(UTC)
        return value.astimezone(UTC).isoformat()

    def process_result_value(
        self, value: str | datetime | None, dialect: Dialect
    ) -> datetime | None:
        if value is None:
            return None
        if isinstance(value, datetime):
            return value.astimezone(UTC)
        return datetime.fromisoformat(value)


class DecimalText(TypeDecorator):
    """Exact decimals: their text on SQLite, `numeric` (any precision) on PostgreSQL."""

    impl = String
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == POSTGRESQL:
            return dialect.type_descriptor(Numeric(asdecimal=True))
        return dialect.type_descriptor(String())

    def process_bind_param(self, value: Decimal | None, dialect: Dialect) -> str | Decimal | None:
        if value is None:
            return None
        exact = Decimal(value)
        return exact if dialect.name == POSTGRESQL else str(exact)

    def process_result_value(self, value: str | Decimal | None, dialect: Dialect) -> Decimal | None:
        return None if value is None else Decimal(value)
