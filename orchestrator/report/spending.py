"""What the ledger's nodes cost by UTC day, by owner and over the month against its cap, and
two pictures of it (SVG): spend per day, and the month's burn-down.

The spans are what the monthly budgets count (`orchestrator.control.money.team_budget`):
every job lease and kept cluster idle lease that may bill in the month, billed to its owner
label. A span costs its recorded price for each second of it inside a window, the ledger's
own measure (`ledger.measures.lease_cost`) on the clipped span, which is `team_budget`'s
`span_cost`: the month's `BurnDown.spent_usd` is the team cap's `Scope.figures().spent_usd`.
`Span` has `team_budget.Span`'s fields, so the same list may be handed to either.

Money is Decimal USD, times aware UTC datetimes. Only `month_spans` reads (the ledger view);
the rest is pure.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from orchestrator.ledger.measures import lease_cost
from orchestrator.report.render import _decimals_for, _note, usd_text

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from orchestrator.ledger.view import LedgerView

HOUR = Decimal(3600)
DAY = timedelta(days=1)
WIDTH_IN, HEIGHT_IN = 8.0, 2.6
SVG_SETTINGS = {"svg.fonttype": "none", "svg.hashsalt": "orch-spending"}
SPEND_COLOUR, CAP_COLOUR, PACE_COLOUR = "#1f77b4", "#d62728", "#7f7f7f"


@dataclass(frozen=True)
class Span:
    """One node's billable time (the fields of `team_budget.Span`)."""

    owner: str | None  # the owner label it is billed to; None: unknown
    price_per_hour: Decimal  # USD, recorded at launch
    launched_at: datetime
    ended_at: datetime | None  # None: still billing


@dataclass(frozen=True)
class _Clipped:
    price_per_hour: Decimal
    launched_at: datetime
    ended_at: datetime


def month_window(now: datetime) -> tuple[datetime, datetime]:
    """The UTC calendar month holding `now`: its first instant, and the next month's (the
    window of `team_budget.month_window`)."""
    now = now.astimezone(UTC)
    start = datetime(now.year, now.month, 1, tzinfo=UTC)
    return start, (start + timedelta(days=32)).replace(day=1)


def month_spans(view: LedgerView, now: datetime) -> list[Span]:
    """Every job lease and kept cluster idle lease that may bill in the month of `now`, with
    the owner label it is billed to, in two reads whatever the ledger's size."""
    start, _ = month_window(now)
    return [Span(*row) for row in view.month_spans(start)]


def span_cost(span: Span, start: datetime, now: datetime) -> Decimal:
    """What `span` cost between `start` and `now` (clipped to both; nothing after `now`)."""
    begin = max(span.launched_at, start)
    end = max(begin, min(span.ended_at or now, now))
    return lease_cost(_Clipped(span.price_per_hour, begin, end), now)


@dataclass(frozen=True)
class DaySpend:
    day: date  # a UTC day
    usd: Decimal


def _midnight(day: date) -> datetime:
    return datetime.combine(day, time(), tzinfo=UTC)


def daily_spend(spans: Iterable[Span], start: datetime, now: datetime) -> list[DaySpend]:
    """Spend per UTC day from the day of `start` to the day of `now`, every day present
    (zeros included); the first day counts from `start`, the last up to `now`. Each span is
    split over the days it covers only, so the work grows with the spans, not days x spans."""
    first, last = start.astimezone(UTC).date(), now.astimezone(UTC).date()
    if last < first:
        return []
    totals = {first + timedelta(days=i): Decimal(0) for i in range((last - first).days + 1)}
    for span in spans:
        begin = max(span.launched_at, start)
        end = min(span.ended_at or now, now)
        day = begin.astimezone(UTC).date()
        while begin < end:
            upto = min(end, _midnight(day + DAY))
            totals[day] += span_cost(span, begin, upto)
            begin, day = upto, day + DAY
    return [DaySpend(day, usd) for day, usd in totals.items()]


def spend_by_owner(
    spans: Iterable[Span], start: datetime, now: datetime
) -> dict[str | None, Decimal]:
    """Spend between `start` and `now` per owner label (None: spans of no known owner),
    largest first; an owner whose spans cost nothing in the window is left out."""
    totals: dict[str | None, Decimal] = {}
    for span in spans:
        cost = span_cost(span, start, now)
        if cost > 0:
            totals[span.owner] = totals.get(span.owner, Decimal(0)) + cost
    return dict(sorted(totals.items(), key=lambda item: (-item[1], item[0] or "")))


@dataclass(frozen=True)
class BurnDown:
    """The month of `now` against a cap: what was spent by the end of each day, and where
    the spend goes at the rate the open spans bill now."""

    month_start: datetime
    month_end: datetime  # the next month's first instant
    now: datetime
    cap_usd: Decimal | None  # None: no monthly cap is set
    cumulative: tuple[DaySpend, ...]  # spend since month_start by each day's end (today: now)
    spent_usd: Decimal  # spent this month by now (`Scope.figures().spent_usd`)
    hourly_usd: Decimal  # what the open spans bill per hour together
    projected_usd: Decimal  # spent_usd + hourly_usd until month_end
    runs_out_at: datetime | None  # when the spend reaches the cap at that rate, if this month

    @property
    def even_pace_usd(self) -> Decimal | None:
        """What spending the cap evenly over the month would have spent by now."""
        if self.cap_usd is None:
            return None
        share = (self.now - self.month_start) / (self.month_end - self.month_start)
        return self.cap_usd * Decimal(str(share))


def burn_down(spans: Iterable[Span], cap_usd: Decimal | None, now: datetime) -> BurnDown:
    """The month of `now`: spend by day, spent so far, and the projection to the month's end
    at the hourly rate of the spans still open; `runs_out_at` is `now` once the cap is
    reached, the moment the projection crosses it within the month, else None."""
    spans = list(spans)
    start, end = month_window(now)
    running = Decimal(0)
    cumulative = []
    for day in daily_spend(spans, start, now):
        running += day.usd
        cumulative.append(DaySpend(day.day, running))
    spent = sum((span_cost(span, start, now) for span in spans), Decimal(0))
    hourly = sum((span.price_per_hour for span in spans if span.ended_at is None), Decimal(0))
    left_s = Decimal(str((end - now).total_seconds()))
    projected = spent + hourly * left_s / HOUR
    runs_out = None
    if cap_usd is not None and spent >= cap_usd:
        runs_out = now
    elif cap_usd is not None and projected >= cap_usd and hourly > 0:
        runs_out = now + timedelta(seconds=float((cap_usd - spent) / hourly * HOUR))
    return BurnDown(start, end, now, cap_usd, tuple(cumulative), spent, hourly, projected, runs_out)


# --- pictures ---------------------------------------------------------------------------------


def _figure() -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(WIDTH_IN, HEIGHT_IN), layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _svg(figure: Figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="svg", metadata={"Date": None})
    return buffer.getvalue()


def _money_axis(axes: Axes, top: float) -> None:
    from matplotlib.ticker import FuncFormatter

    decimals = _decimals_for(top)
    axes.yaxis.set_major_formatter(FuncFormatter(lambda v, _: rf"\${v:,.{decimals}f}"))
    axes.set_ylim(0, top * 1.1 if top > 0 else 1.0)
    axes.grid(True, alpha=0.3)


def _date_axis(axes: Axes) -> None:
    from matplotlib.dates import AutoDateLocator, ConciseDateFormatter

    locator = AutoDateLocator(maxticks=10)
    axes.xaxis.set_major_locator(locator)
    axes.xaxis.set_major_formatter(ConciseDateFormatter(locator))


def render_daily_svg(days: Sequence[DaySpend]) -> bytes:
    """Spend per UTC day as bars (one per day, gid `bar:YYYY-MM-DD`, centred on the day's
    tick), as SVG bytes."""
    import matplotlib

    with matplotlib.rc_context(SVG_SETTINGS):
        figure = _figure()
        axes = figure.add_subplot()
        axes.set_ylabel("spend per day (USD)")
        values = [float(day.usd) for day in days]
        if days:
            bars = axes.bar(
                [_midnight(day.day) for day in days], values, width=0.8,
                color=SPEND_COLOUR, label="spend",
            )  # fmt: skip
            for day, bar in zip(days, bars, strict=True):
                bar.set_gid(f"bar:{day.day.isoformat()}")
            _date_axis(axes)
        if not any(values):
            _note(axes, "nothing billed in these days")
        _money_axis(axes, max(values, default=0.0))
        axes.set_xlabel("UTC day")
        return _svg(figure)


def render_burn_down_svg(burn: BurnDown) -> bytes:
    """The month's burn-down as SVG bytes: the cumulative spend (gid `series:spend`), the cap
    (`series:cap`) and the even pace to it (`series:pace`) when there is one, and the
    projection at the current rate, dashed (`series:projection`)."""
    import matplotlib

    with matplotlib.rc_context(SVG_SETTINGS):
        figure = _figure()
        axes = figure.add_subplot()
        axes.set_ylabel("spent this month (USD)")
        times = [burn.month_start] + [
            min(_midnight(day.day) + DAY, burn.now) for day in burn.cumulative
        ]
        values = [0.0] + [float(day.usd) for day in burn.cumulative]
        series: list[tuple[str, Any]] = [
            ("spend", axes.plot(times, values, color=SPEND_COLOUR, linewidth=1.8, label="spent")),
            (
                "projection",
                axes.plot(
                    [burn.now, burn.month_end], [float(burn.spent_usd), float(burn.projected_usd)],
                    color=SPEND_COLOUR, linestyle="--", linewidth=1.4,
                    label=f"at {usd_text(burn.hourly_usd)}/h now",
                ),
            ),
        ]  # fmt: skip
        top = max(float(burn.projected_usd), *values)
        if burn.cap_usd is not None:
            cap = float(burn.cap_usd)
            series.append(
                (
                    "cap",
                    [axes.axhline(cap, color=CAP_COLOUR, linewidth=1.4, label=f"cap ${cap:,.2f}")],
                )
            )
            pace = axes.plot(
                [burn.month_start, burn.month_end], [0.0, cap], color=PACE_COLOUR,
                linestyle=":", linewidth=1.2, label="even pace",
            )  # fmt: skip
            series.append(("pace", pace))
            top = max(top, cap)
        else:
            _note(axes, "no monthly cap is set (budget.monthly_usd)")
        for name, lines in series:
            for line in lines:
                line.set_gid(f"series:{name}")
        if burn.runs_out_at is not None and burn.runs_out_at < burn.month_end:
            axes.axvline(burn.runs_out_at, color=CAP_COLOUR, linestyle="--", linewidth=1.0,
                         label=f"cap reached {burn.runs_out_at:%m-%d %H:%M}")  # fmt: skip
        axes.set_xlim(burn.month_start, burn.month_end)
        _date_axis(axes)
        _money_axis(axes, top)
        axes.set_xlabel(f"{burn.month_start:%B %Y} (UTC)")
        axes.legend(loc="best", fontsize=8)
        return _svg(figure)
