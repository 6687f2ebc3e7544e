"""The figures of bench/'s benchmarks, read from what each one prints (`bench.run_all` runs
them and writes the page): each figure with the baseline measured in the same run, its ratio,
and the benchmark's own target. Each reader mirrors its benchmark's print statements; one
that finds nothing returns no figure, which the page reports as a failed benchmark.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Figure:
    """One measured figure, with the baseline measured in the same run (None: no baseline)."""

    name: str
    value: float
    unit: str
    baseline: float | None = None
    baseline_name: str = ""
    target: str = ""  # what the benchmark aims at, as it says it ("ratio <= 1.3", "< 3 %")
    bound: float | None = None  # the target as a number: value (or ratio) <= bound
    bound_on_ratio: bool = False
    at_least: bool = False  # the target is a floor: value (or ratio) >= bound

    @property
    def ratio(self) -> float | None:
        if self.baseline is None or self.baseline == 0:
            return None
        return self.value / self.baseline

    @property
    def met(self) -> bool | None:
        """Whether the target is met (None: no target)."""
        if self.bound is None:
            return None
        measured = self.ratio if self.bound_on_ratio else self.value
        if measured is None:
            return False
        return measured >= self.bound if self.at_least else measured <= self.bound


Parser = Callable[[str], list[Figure]]


_NUMBER = r"-?\d+(?:\.\d+)?"
_REPORT_TITLE = re.compile(rf"\(machine: .*; medians; target ratio <= (?P<target>{_NUMBER})\)")
_REPORT_ROW = re.compile(
    rf"^\s+(?P<name>\S.*?)\s+orch\s+(?P<ours>{_NUMBER}) s\s+baseline\s+(?P<base>{_NUMBER}) s"
    rf"\s+ratio\s+{_NUMBER}\s*$",
    re.MULTILINE,
)


def report_rows(baseline_name: str) -> Parser:
    """Rows printed by `bench.common.report` (launch overhead, sync speed)."""

    def parse(text: str) -> list[Figure]:
        title = _REPORT_TITLE.search(text)
        bound = float(title.group("target")) if title else None
        return [
            Figure(
                name=m.group("name"),
                value=float(m.group("ours")),
                unit="s",
                baseline=float(m.group("base")),
                baseline_name=baseline_name,
                target=f"ratio <= {bound:g}" if bound is not None else "",
                bound=bound,
                bound_on_ratio=True,
            )
            for m in _REPORT_ROW.finditer(text)
        ]

    return parse


_CPU = re.compile(
    rf"controller CPU watching (?P<nodes>\d+) nodes .*?: (?P<ours>{_NUMBER}) % of one core"
    rf" \(target < (?P<target>{_NUMBER}) %\)\s*\nbaseline, (?P<bname>.*?): (?P<base>{_NUMBER}) %",
    re.DOTALL,
)


def parse_controller_cpu(text: str) -> list[Figure]:
    m = _CPU.search(text)
    if not m:
        return []
    return [
        Figure(
            name=f"controller watching {m.group('nodes')} nodes",
            value=float(m.group("ours")),
            unit="% of one core",
            baseline=float(m.group("base")),
            baseline_name=m.group("bname"),
            target=f"< {m.group('target')} %",
            bound=float(m.group("target")),
        )
    ]


_IDLE = re.compile(
    rf"idle-shutdown latency \(idle_timeout (?P<timeout>{_NUMBER}) s, watch interval "
    rf"(?P<interval>{_NUMBER}) s\): median (?P<median>{_NUMBER}) s over (?P<n>\d+) trials"
)


def parse_idle_latency(text: str) -> list[Figure]:
    m = _IDLE.search(text)
    if not m:
        return []
    timeout, interval = float(m.group("timeout")), float(m.group("interval"))
    return [
        Figure(
            name="GPUs idle -> stop",
            value=float(m.group("median")),
            unit="s",
            baseline=timeout,
            baseline_name="the idle_timeout: the least any idle stop can take",
            target=f"<= idle_timeout + 2 intervals ({timeout + 2 * interval:g} s)",
            bound=timeout + 2 * interval,
        )
    ]


_THROUGHPUT = re.compile(
    rf"^\s+(?P<model>\S+)\s+workers=(?P<w>\d+): +(?P<rate>{_NUMBER}) img/s", re.MULTILINE
)


def parse_trainer_throughput(text: str) -> list[Figure]:
    rates: dict[str, dict[int, float]] = {}
    for m in _THROUGHPUT.finditer(text):
        rates.setdefault(m.group("model"), {})[int(m.group("w"))] = float(m.group("rate"))
    return [
        Figure(
            name=f"{model}, 2 DataLoader workers",
            value=by[2],
            unit="img/s",
            baseline=by[0],
            baseline_name="0 workers: loading in-process",
        )
        for model, by in rates.items()
        if 0 in by and 2 in by
    ]


_SPOT_ROW = re.compile(rf"^\s+(?P<key>[a-z_]+_s)\s+(?P<med>{_NUMBER}) s\s+\(", re.MULTILINE)
_SPOT_RATIO = re.compile(
    rf"resume / cold start\s+orch (?P<ours>{_NUMBER}) s / baseline (?P<base>{_NUMBER}) s"
)
_SPOT_TARGETS = {"detection_s": 5.0, "resume_s": 20.0}  # seconds, as the benchmark says
_SPOT_PARTIAL = re.compile(
    rf"lost node / whole cluster\s+recovery (?P<ours>{_NUMBER}) s / (?P<base>{_NUMBER}) s"
)
_SPOT_WHOLE_SECTION = "replacing the whole cluster"  # its rows are the partial figure's baseline
_SPOT_PARTIAL_BOUND = 0.8  # lost node alone / whole cluster, as the benchmark says


def parse_spot_recovery(text: str) -> list[Figure]:
    ratio = _SPOT_RATIO.search(text)
    if not ratio:
        return []
    resume_bound = _SPOT_TARGETS["resume_s"]
    figures = [
        Figure(
            name="resume after a notice (new nodes' launch time left out)",
            value=float(ratio.group("ours")),
            unit="s",
            baseline=float(ratio.group("base")),
            baseline_name="cold start of the same job on fresh nodes",
            target=f"<= {resume_bound:g} s",
            bound=resume_bound,
        )
    ]
    partial = _SPOT_PARTIAL.search(text)
    if partial:
        figures.append(
            Figure(
                name="recovery replacing the lost node alone (launch included)",
                value=float(partial.group("ours")),
                unit="s",
                baseline=float(partial.group("base")),
                baseline_name="replacing the whole cluster, same trials",
                target=f"ratio <= {_SPOT_PARTIAL_BOUND:g}",
                bound=_SPOT_PARTIAL_BOUND,
                bound_on_ratio=True,
            )
        )
    for m in _SPOT_ROW.finditer(text.split(_SPOT_WHOLE_SECTION)[0]):
        key = m.group("key")
        if key in ("resume_s", "cold_start_s"):
            continue  # shown above, as the figure and its baseline
        bound = _SPOT_TARGETS.get(key)
        figures.append(
            Figure(
                name=key.removesuffix("_s").replace("_", " "),
                value=float(m.group("med")),
                unit="s",
                target=f"<= {bound:g} s" if bound is not None else "",
                bound=bound,
            )
        )
    return figures


_CHECKPOINT_ROW = re.compile(
    rf"^\s+(?P<name>\S.*?)\s+orch\s+(?P<ours>{_NUMBER}) (?P<unit>\S+)\s+baseline\s+"
    rf"(?P<base>{_NUMBER}) \S+\s+\((?P<bname>[^)]*)\)\s+ratio\s+(?:{_NUMBER}|-)\s+"
    r"target (?P<target>.+?)\s*$",
    re.MULTILINE,
)
_TARGET = re.compile(rf"^(?P<ratio>ratio )?(?P<op><=|>=) (?P<bound>{_NUMBER})")


def parse_checkpoint_speed(text: str) -> list[Figure]:
    """Rows of `bench.checkpoint_speed` (and of `checkpoint_capture` and `loss_detection`,
    which print theirs the same way): each with its own target (`<= N s`, `ratio <= N`,
    `ratio >= N`, `>= N`, or `-` for none); a ratio `-` has a baseline of 0."""
    figures = []
    for m in _CHECKPOINT_ROW.finditer(text):
        target = _TARGET.match(m.group("target"))
        figures.append(
            Figure(
                name=m.group("name"),
                value=float(m.group("ours")),
                unit=m.group("unit"),
                baseline=float(m.group("base")),
                baseline_name=m.group("bname"),
                target=m.group("target") if target else "",
                bound=float(target.group("bound")) if target else None,
                bound_on_ratio=bool(target and target.group("ratio")),
                at_least=bool(target and target.group("op") == ">="),
            )
        )
    return figures


_GUARD = re.compile(
    rf"guarded \(max_runtime (?P<runtime>{_NUMBER}) s\)\s+(?P<ours>{_NUMBER}) instance-s\s+"
    rf"bound (?P<bound>{_NUMBER})\n\s+no limit \(as before the guard\)\s+"
    rf"(?P<base>{_NUMBER}) instance-s in (?P<window>{_NUMBER}) s"
)


def parse_guard_billing(text: str) -> list[Figure]:
    m = _GUARD.search(text)
    if not m:
        return []
    return [
        Figure(
            name=f"billed after the controller's death (max_runtime {m.group('runtime')} s)",
            value=float(m.group("ours")),
            unit="instance-s",
            baseline=float(m.group("base")),
            baseline_name=f"the same hung job with no limit, over {m.group('window')} s "
            "and still billing",
            target=f"<= {m.group('bound')} instance-s (2 x (max_runtime + grace + 15 s))",
            bound=float(m.group("bound")),
        )
    ]


_STARTUP = re.compile(
    rf"^  (?P<name>orch [a-z -]+?)\s+(?P<ours>{_NUMBER}) s\s+baseline\s+(?P<base>{_NUMBER}) s\s+"
    rf"ratio\s+{_NUMBER}(?:\s+target <= (?P<bound>{_NUMBER}) s)?",
    re.MULTILINE,
)


def parse_cli_startup(text: str) -> list[Figure]:
    return [
        Figure(
            name=m.group("name"),
            value=float(m.group("ours")),
            unit="s",
            baseline=float(m.group("base")),
            baseline_name="python -c 'import typer, rich.console'",
            target=f"<= {m.group('bound')} s" if m.group("bound") else "",
            bound=float(m.group("bound")) if m.group("bound") else None,
        )
        for m in _STARTUP.finditer(text)
    ]


_TEAM_ROW = re.compile(
    rf"^  (?P<name>\S.*?)\s+(?P<ours>{_NUMBER}) (?P<unit>s|%)\s+"
    rf"(?:baseline\s+(?P<base>{_NUMBER}) (?:s|%) \((?P<bname>[^)]*)\)\s+ratio\s+{_NUMBER}"
    r"|baseline - ratio -)\s+target (?P<target>.+?): (?P<verdict>met|NOT met|-)\s*$",
    re.MULTILINE,
)
_TEAM_BOUND = re.compile(rf"^<=? (?P<bound>{_NUMBER})")


def parse_team_scale(text: str) -> list[Figure]:
    """Rows of `bench.team_scale` (`row`): each with its baseline and target; a target with
    no number (no failures) keeps its verdict in its words."""
    figures = []
    for m in _TEAM_ROW.finditer(text):
        bound = _TEAM_BOUND.match(m.group("target"))
        figures.append(
            Figure(
                name=m.group("name"),
                value=float(m.group("ours")),
                unit="% of one core" if m.group("unit") == "%" else "s",
                baseline=float(m.group("base")) if m.group("base") else None,
                baseline_name=m.group("bname") or "",
                target=m.group("target") if bound else f"{m.group('target')}: {m.group('verdict')}",
                bound=float(bound.group("bound")) if bound else None,
            )
        )
    return figures


_HOST_SUMMARY = '{"benchmark": "controller_host"'
_HOST_FIGURES = {
    "submit_to_first_step_s": "submit -> first step through the host",
    "recovery_s": "recovery through the host (PREEMPTED -> every rank restarted)",
}


def parse_controller_host(text: str) -> list[Figure]:
    """The JSON line of `bench.controller_host`: each figure's median through the host, with
    the laptop controller's in the same trials as its baseline (no target)."""
    lines = [line for line in text.splitlines() if line.startswith(_HOST_SUMMARY)]
    if not lines:
        return []
    summary = json.loads(lines[-1])
    return [
        Figure(
            name=name,
            value=float(summary[key]["host"]),
            unit="s",
            baseline=float(summary[key]["laptop"]),
            baseline_name="a laptop controller (`--no-remote`), same trials",
        )
        for key, name in _HOST_FIGURES.items()
        if key in summary
    ]
