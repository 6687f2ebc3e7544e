"""Which jobs answer a command (`cli.on_host`): decided once typer has parsed the arguments,
never by reading argv before it. `main` hands argv to typer as it is, and a value option of
any command (one no list of the CLI names) leaves the job id where typer finds it."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from orchestrator.host import record as records
from orchestrator.host.record import HostRecord
from tests.support.in_process import isolated_home, run_main

JOB = "far-a1b2c3"  # a job submitted to the controller host
SPEC = "name: local\nworkdir: .\nrun: python train.py\n"


def _host_of(home: Path, job_id: str) -> None:
    """A controller host that drives `job_id`, at an address where nothing answers."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    public = Ed25519PrivateKey.generate().public_key()
    host_key = public.public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH).decode()
    records.save(home, HostRecord(
        kind="adopted", user="root", host="127.0.0.1", port=1, host_key=host_key,
        identity=None, root="/root/.orch-host", autostop_s=0.0, version="0.1.0",  # type: ignore[arg-type]
        installed_at="2026-01-01T00:00:00+00:00", jobs=[job_id],
    ))  # fmt: skip


def test_main_hands_argv_to_typer_untouched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.cli.app import main

    isolated_home(tmp_path, monkeypatch)
    spec = tmp_path / "job.yaml"
    spec.write_text(SPEC)
    argv = ["orch", "submit", str(spec), "--no-remote", "--dry-run", "--json"]
    given = list(argv)
    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    with pytest.raises(SystemExit) as done:
        main()
        raise SystemExit(0)
    assert done.value.code in (0, None)
    assert sys.argv is argv and argv == given


def test_the_cli_keeps_no_list_of_options_to_route_by() -> None:
    from orchestrator.cli import controller_host

    for name in ("route", "VALUE_OPTIONS", "ROUTED", "_first_positional"):
        assert not hasattr(controller_host, name), name


@pytest.mark.parametrize(
    "argv",
    [
        ["status", "--events", "all", JOB],  # --events: on no hand-kept list of value options
        ["status", JOB, "--events", "3"],
        ["cost", "--job", JOB],
        ["cancel", JOB],
    ],
)
def test_a_job_on_the_host_is_asked_there_whatever_options_come_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argv: list[str]
) -> None:
    home = isolated_home(tmp_path, monkeypatch)
    _host_of(home, JOB)
    code, out, err = run_main(argv)
    assert code != 0 and "cannot reach controller host at [127.0.0.1]:1" in err, out + err


def test_a_job_not_on_the_host_is_this_ledgers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = isolated_home(tmp_path, monkeypatch)
    _host_of(home, JOB)
    code, out, err = run_main(["status", "--events", "all", "here-a1b2c3"])
    assert code != 0 and "controller host" not in err, err


def _parsed_submit(argv: list[str]) -> dict[str, object]:
    """What typer makes of `orch submit ARGV`: the submit command's parameters."""
    import typer.main

    from orchestrator.cli.app import app

    submit = typer.main.get_command(app).commands["submit"]  # type: ignore[attr-defined]
    return dict(submit.make_context("submit", list(argv)).params)


def test_a_submit_for_the_host_carries_every_option_typer_parsed() -> None:
    from orchestrator.control.verbs.jobs import SubmitRequest

    argv = ["job.yaml", "--nodes", "2", "--gpus", "4", "--provider", "aws", "--no-spot",
            "--max-cost", "12.5", "--idle-timeout", "10m", "--env", "A=1", "--env", "B",
            "--secret", "TOKEN", "--notify", "curl -d @- x", "-c", "dev", "--autostop", "never",
            "--no-wait", "--fresh", "--strict", "-y", "--json", "--remote"]  # fmt: skip
    params = _parsed_submit(argv)
    fields = {k: v for k, v in params.items() if k not in ("remote", "detach")}
    fields = {**fields, "env": tuple(fields["env"]), "secret": tuple(fields["secret"])}
    request = SubmitRequest(**fields)  # type: ignore[arg-type]
    again = _parsed_submit(request.argv())
    assert again == {**params, "remote": False}  # the same job, without the routing flag
