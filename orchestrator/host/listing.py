"""Lists of jobs on this machine with the jobs it submitted to the controller host: `orch
status` and `orch cost` show both, the host's rows marked. Pure: no I/O, nothing heavy to
import (the list views start without SQLModel, the settings or SSH)."""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal

from orchestrator.job_state import JobState


def merged_jobs(
    local: list[dict], remote: list[dict], ids: Sequence[str], where: str
) -> list[dict]:
    """`orch status`'s or `orch cost`'s rows of this ledger, then the host's rows of the jobs
    submitted from here (`ids`), each marked with `controller_host` (`where`). Pure."""
    seen = {row["id"] for row in local}
    wanted = set(ids)
    return [
        *local,
        *({**row, "controller_host": where} for row in remote
          if row.get("id") in wanted and row["id"] not in seen),
    ]  # fmt: skip


def merged_total(local_total: float, remote: list[dict], ids: Sequence[str]) -> float:
    """This ledger's total plus the spend of the host's jobs submitted from here (exact
    decimals, a number only at the edge, as `report.documents.money`). Pure."""
    total = Decimal(str(local_total))
    wanted = set(ids)
    for row in remote:
        if row.get("id") in wanted:
            total += Decimal(str(row.get("spend_usd") or 0))
    return float(total)


def all_final(rows: list[dict], ids: Sequence[str]) -> bool:
    """Whether `rows` (a host's answer kept from before) hold every job of `ids` in a final
    state: a final row never changes, so the host need not be asked again. Pure."""
    states = {row.get("id"): row.get("state") for row in rows}
    return all(_final(states.get(job_id)) for job_id in ids)


def _final(state: object) -> bool:
    try:
        return JobState(str(state)).is_final
    except ValueError:
        return False
