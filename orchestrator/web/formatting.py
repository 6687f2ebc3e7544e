"""How the pages write values for people: money, durations, times, numbers (Jinja2 filters)."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

from jinja2 import Environment

from orchestrator.report.render import usd_text


def money_text(value: Decimal | float | None) -> str:
    """USD as `orch report` writes it (`usd_text`); "-" when unknown."""
    return "-" if value is None else usd_text(value)


def duration_text(seconds: float | None) -> str:
    """1 h 05 min, 3 min 20 s, 42 s; "-" when unknown."""
    if seconds is None:
        return "-"
    seconds = max(0, int(seconds))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes:02d} min"
    if minutes:
        return f"{minutes} min {secs:02d} s"
    return f"{secs} s"


def time_text(iso: str | None) -> str:
    """An ISO time as `2026-12-07 09:30:12 UTC`; "-" when none."""
    if not iso:
        return "-"
    try:
        return f"{datetime.fromisoformat(iso):%Y-%m-%d %H:%M:%S} UTC"
    except ValueError:
        return str(iso)[:40]


def number_text(value: Any, digits: int = 4) -> str:
    """A loss or rate: `digits` significant figures; "-" when none."""
    if value is None:
        return "-"
    try:
        return f"{float(value):.{digits}g}"
    except (TypeError, ValueError):
        return "-"


def spend_share(spend: float | None, budget: float | None) -> int | None:
    """Percent of the budget spent (0-100, for a bar); None without a budget."""
    if not budget or spend is None:
        return None
    return max(0, min(100, round(100 * spend / budget)))


def install_filters(env: Environment) -> None:
    env.filters.update(
        usd=money_text,
        duration=duration_text,
        when=time_text,
        num=number_text,
        share=spend_share,
    )
