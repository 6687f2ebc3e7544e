"""`orch fleet add` refuses bad input with exit 2 before any machine is contacted, and
`orch fleet remove` / `status` an unknown fleet, each saying what to do (in this process)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.in_process import isolated_home, run_main

CASES = {
    "no name": (["--host", "u@a", "--identity", "KEY"], ["name the fleet"]),
    "no host": (["lab", "--identity", "KEY"], ["hosts:"]),
    "bad login": (["lab", "--host", "10.0.0.5", "--identity", "KEY"], ["USER@ADDR[:PORT]"]),
    "both prices": (
        [
            "lab",
            "--host",
            "u@a",
            "--identity",
            "KEY",
            "--price-per-hour",
            "1",
            "--price-per-gpu-hour",
            "1",
        ],
        ["not both"],
    ),  # fmt: skip
    "bad price": (
        ["lab", "--host", "u@a", "--identity", "KEY", "--price-per-hour", "x"],
        ["price_per_hour", "not a price"],
    ),  # fmt: skip
    "file and flags": (["--file", "fleet.yaml", "--host", "u@a"], ["leave out --host"]),
    "identity not there": (
        ["lab", "--host", "u@a", "--identity", "absent"],
        ["absent is not a file"],
    ),
    "known_hosts not there": (
        ["lab", "--host", "u@a", "--identity", "KEY", "--known-hosts", "nope"],
        ["known_hosts file", "nope is not a file"],
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_refused_before_any_probe(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    isolated_home(tmp_path, monkeypatch)
    key = tmp_path / "id"
    key.write_text("not read: nothing is contacted\n")
    monkeypatch.chdir(tmp_path)
    args, expected = CASES[case]
    code, out, err = run_main(["fleet", "add", *[str(key) if a == "KEY" else a for a in args]])
    output = " ".join((out + err).split())
    assert code == 2, output
    assert "Traceback" not in output and "probing" not in output
    for fragment in expected:
        assert fragment in output, output


def test_an_unknown_fleet_names_the_fleets_there_are(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    isolated_home(tmp_path, monkeypatch)
    for command in (["remove", "lab"], ["status", "lab"]):
        code, out, err = run_main(["fleet", *command])
        assert code == 2 and "no fleet 'lab' in the ledger (fleets: none)" in err
        assert "orch fleet add" in err


def test_a_machine_of_another_fleet_is_refused_before_any_probe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    isolated_home(tmp_path, monkeypatch)
    from orchestrator.cli.context import open_ledger
    from orchestrator.config import load_settings
    from orchestrator.ledger.fleets import FleetBook
    from tests.unit.ledger.test_fleet_book import fleet, host

    FleetBook(open_ledger(load_settings())).add(fleet("lab"), [host("10.0.0.5")])
    key = tmp_path / "id"
    key.write_text("not read: nothing is contacted\n")
    args = ["lab2", "--host", "u@10.0.0.6", "--host", "u@10.0.0.5", "--identity", str(key)]
    code, out, err = run_main(["fleet", "add", *args])
    output = " ".join((out + err).split())
    assert code == 2 and "probing" not in output, output
    assert "10.0.0.5:22 (in fleet lab) is in another fleet already" in output
    assert "orch fleet remove lab" in output
    code, out, _ = run_main(["fleet", "status", "--json"])
    assert code == 0 and '"lab2"' not in out
