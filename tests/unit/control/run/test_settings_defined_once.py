"""Each setting is defined once: its type, default and ORCH_* variable on its field of
`orchestrator.config`; the runner's knobs that are settings take default and value from it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from orchestrator import config
from orchestrator.config import ControllerSettings, Env
from orchestrator.control.run.options import RunnerOptions


def test_the_variables_are_the_marks_on_the_settings() -> None:
    marks = {}
    for section, field in config.Settings.model_fields.items():
        model = field.annotation
        for name, info in getattr(model, "model_fields", {}).items():
            marks |= {m.name: (section, name) for m in info.metadata if isinstance(m, Env)}
    assert marks == config._ENV_OVERRIDES
    assert len(set(marks.values())) == len(marks), "a setting with two variables"
    assert all(var.startswith("ORCH_") for var in marks)


def test_a_variable_sets_its_setting_and_wins_over_the_file(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("controller: {watch_interval: 7}\nlogs: {keep: 4}\n")
    env = {"ORCH_HOME": str(tmp_path), "ORCH_WATCH_INTERVAL": "2.5", "ORCH_LOGS_KEEP": ""}
    settings = config.load_settings(env)
    assert settings.controller.watch_interval == 2.5
    assert settings.logs.keep == 4  # an empty variable is unset


def test_the_runner_takes_every_knob_that_is_a_setting_from_the_settings() -> None:
    shared = [
        f.name
        for f in dataclasses.fields(RunnerOptions)
        if f.name in ControllerSettings.model_fields
    ]
    assert len(shared) == 14
    assert RunnerOptions.from_settings(ControllerSettings()) == RunnerOptions()
    changed = {name: getattr(ControllerSettings(), name) * 2 + 1 for name in shared}
    options = RunnerOptions.from_settings(ControllerSettings(**changed))
    assert {name: getattr(options, name) for name in shared} == changed
    assert options.lost_after == RunnerOptions().lost_after  # not a setting: the runner's own
