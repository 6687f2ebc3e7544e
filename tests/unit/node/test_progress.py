from __future__ import annotations

from orchestrator.node.progress import (
    describe_event,
    local_rank_line,
    parse_metrics,
    rank_lines,
)


def test_rank_prefix() -> None:
    assert local_rank_line("[default1]:hello") == (1, "hello")
    assert local_rank_line("W1130 torch/distributed/run.py:982]") == (
        None,
        "W1130 torch/distributed/run.py:982]",
    )


def test_metrics_parsing_is_strict_about_step() -> None:
    m = parse_metrics('{"step": 12, "epoch": 1, "loss": 0.5, "lr": 0.1, "img_s": 300.5}')
    assert m is not None and (m.step, m.loss, m.img_s) == (12, 0.5, 300.5)
    assert parse_metrics('{"event": "done", "step": 40}').step == 40  # type: ignore[union-attr]
    assert parse_metrics('{"event": "checkpoint", "step": 40}') is None
    assert parse_metrics('{"step": "12"}') is None
    assert parse_metrics('{"step": true}') is None
    assert parse_metrics("{not json") is None
    assert parse_metrics("plain text") is None
    assert parse_metrics('{"step": 3, "loss": "nan?"}').loss is None  # type: ignore[union-attr]


def test_a_line_nested_past_the_parsers_depth_is_no_progress() -> None:
    # A rank's line (cut at 64 KiB by the reader) can nest deeper than json's recursion limit,
    # which raises RecursionError, not ValueError: the run watch must read on.
    assert parse_metrics('{"a": ' * 30_000) is None


def test_rank_lines_filters_one_local_rank() -> None:
    log = "[default0]:a\n[default1]:b\ntorchrun says\n[default0]:c\n"
    assert rank_lines(log, 0) == ["a", "c"]
    assert rank_lines(log, 1) == ["b"]
    assert rank_lines(log, None) == log.splitlines()


def test_events_are_described_for_humans() -> None:
    line = describe_event('{"event": "checkpoint", "step": 12, "path": "/x/step-000012"}')
    assert line == "rank 0: checkpoint (step 12, path /x/step-000012)"
    assert describe_event('{"step": 1}') is None
    assert describe_event("not json") is None
