"""`orchestrator.host.submission`: what `orch submit --remote` sends to the host. A secret's
value never reaches the host's command line; it goes into the file sent over SSH stdin."""

from __future__ import annotations

import subprocess

import pytest

from orchestrator.errors import SpecError
from orchestrator.host.listing import merged_jobs, merged_total
from orchestrator.host.remote_jobs import two_hop_forwards
from orchestrator.host.submission import (
    host_spec,
    moved_record,
    secrets_file_text,
    spec_secrets,
    split_args,
)
from orchestrator.remote.shell import parse_forward


def test_routing_flags_and_the_spec_are_left_out_and_detach_added_once() -> None:
    argv = ["--remote", "job.yaml", "--detach", "--json", "--no-remote", "--yes"]
    plan = split_args(argv, 1, {})
    assert plan.args == ["--json", "--yes", "--detach"]
    assert plan.spec_index == 1 and plan.secrets == {}


@pytest.mark.parametrize(
    "secret_args",
    [["--secret", "TOKEN=v=1 x"], ["--secret=TOKEN=v=1 x"], ["--secret", "TOKEN"],
     ["--secret=TOKEN"]],
)  # fmt: skip
def test_secret_values_move_out_of_the_arguments(secret_args: list[str]) -> None:
    plan = split_args(["job.yaml", *secret_args, "--json"], 0, {"TOKEN": "v=1 x"})
    assert plan.args == ["--secret", "TOKEN", "--json", "--detach"]
    assert plan.secrets == {"TOKEN": "v=1 x"}
    assert not any("v=1" in arg for arg in plan.args)


def test_a_secret_named_but_unset_here_or_missing_is_refused() -> None:
    with pytest.raises(SpecError, match=r"\$TOKEN is not set"):
        split_args(["job.yaml", "--secret", "TOKEN"], 0, {})
    with pytest.raises(SpecError, match="needs NAME"):
        split_args(["job.yaml", "--secret"], 0, {})


def test_spec_secrets_takes_the_unvalued_ones_set_in_this_shell() -> None:
    spec = {"secrets": {"A": None, "B": None, "C": "given in the spec"}}
    assert spec_secrets(spec, {"A": "a", "C": "from shell"}) == {"A": "a"}
    assert spec_secrets({}, {"A": "a"}) == {}


def test_the_secrets_file_gives_back_each_value_exactly() -> None:
    secrets = {"A": 'it\'s $HOME `id` "q" \\', "B": "two\nlines", "C": ""}
    script = secrets_file_text(secrets) + 'printf "%s|%s|%s" "$A" "$B" "$C"'
    done = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True)
    assert done.stdout == "|".join(secrets.values())


def test_host_spec_moves_workdir_and_data_under_the_submission() -> None:
    spec = {"name": "n", "workdir": "work", "data": [{"src": "d1", "dest": "/x"}, {"src": "d2"}]}
    moved = host_spec(spec, "/h/submissions/abc")
    assert moved["workdir"] == "/h/submissions/abc/work"
    assert moved["data"] == [
        {"src": "/h/submissions/abc/data/0", "dest": "/x"},
        {"src": "/h/submissions/abc/data/1"},
    ]
    assert spec["workdir"] == "work" and spec["data"][0]["src"] == "d1", "the input changed"
    assert "data" not in host_spec({"name": "n"}, "/s")
    assert "data" not in host_spec({"name": "n", "data": []}, "/s")


def test_a_forward_to_a_node_of_a_job_on_the_host_becomes_two_hops() -> None:
    forwards = [parse_forward("6006:localhost:6006"), parse_forward("0.0.0.0:8888:10.0.0.9:80")]
    here, there = two_hop_forwards(forwards, [40001, 40002])
    # this machine's ports reach free ports of the host ...
    assert [f.option() for f in here] == ["127.0.0.1:6006:127.0.0.1:40001",
                                          "0.0.0.0:8888:127.0.0.1:40002"]  # fmt: skip
    # ... and the host's `orch ssh` forwards those to HOST:REMOTE as the node sees it
    assert there == ["-L", "40001:localhost:6006", "-L", "40002:10.0.0.9:80"]


def test_lists_here_add_the_hosts_rows_of_jobs_submitted_from_here() -> None:
    local = [{"id": "a", "spend_usd": 1.25}]
    remote = [{"id": "b", "spend_usd": 0.1}, {"id": "c", "spend_usd": 9.0}, {"id": "a"}]
    rows = merged_jobs(local, remote, ["b", "a"], "root@10.0.0.5")
    # c was submitted from another machine; a is this ledger's own row, kept as it is
    assert rows == [{"id": "a", "spend_usd": 1.25},
                    {"id": "b", "spend_usd": 0.1, "controller_host": "root@10.0.0.5"}]  # fmt: skip
    assert merged_total(1.25, remote, ["b"]) == 1.35  # exact decimals, a number at the edge


def test_a_record_moved_to_a_new_hosts_folder_points_only_its_own_paths_there() -> None:
    old, new = "/x/.orch-host/submissions/ab12", "/y/.orch-host/submissions/ab12"
    record = {
        "spec": {"workdir": f"{old}/work", "data": [{"src": f"{old}/data/0", "dst": "/data"}],
                 "run": "python train.py"},
        "source": f"{old}/job.yaml",
        "workdir": f"{old}/work",
        "data_sources": [f"{old}/data/0"],
        "base_dir": old,
    }  # fmt: skip
    moved = moved_record(record, old, new)
    assert moved == {
        "spec": {"workdir": f"{new}/work", "data": [{"src": f"{new}/data/0", "dst": "/data"}],
                 "run": "python train.py"},
        "source": f"{new}/job.yaml",
        "workdir": f"{new}/work",
        "data_sources": [f"{new}/data/0"],
        "base_dir": new,
    }  # fmt: skip
    # A sibling folder that only starts with the same characters is not the submission's.
    assert moved_record({"w": f"{old}0/work"}, old, new) == {"w": f"{old}0/work"}
