"""`orchestrator.host.submission`: what `orch submit --remote` sends to the host. A secret's
value never reaches the host's command line nor any file sent there: it travels over SSH stdin
into the environment of the host's `orch submit`, and the host's copy of the spec names each
secret without its value."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from orchestrator.errors import SpecError
from orchestrator.host.layout import HostLayout, env_file_text
from orchestrator.host.listing import merged_jobs, merged_total
from orchestrator.host.remote_jobs import two_hop_forwards
from orchestrator.host.submission import (
    host_spec,
    inline_secrets,
    is_bucket_item,
    moved_record,
    secrets_text,
    spec_secrets,
    split_args,
    submit_command,
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


def test_the_secrets_text_gives_back_each_value_exactly() -> None:
    secrets = {"A": 'it\'s $HOME `id` "q" \\', "B": "two\nlines", "C": ""}
    script = secrets_text(secrets) + 'printf "%s|%s|%s" "$A" "$B" "$C"'
    done = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True)
    assert done.stdout == "|".join(secrets.values())


def test_inline_secrets_are_read_as_the_spec_loader_reads_them() -> None:
    spec = {"secrets": {"A": "tok-$USER_ID$$x", "B": 8, "C": True, "D": None, "E": 0.5}}
    assert inline_secrets(spec, {"USER_ID": "42"}) == {
        "A": "tok-42$x", "B": "8", "C": "true", "E": "0.5"
    }  # fmt: skip
    assert inline_secrets({}, {}) == {} and inline_secrets({"secrets": "x"}, {}) == {}
    with pytest.raises(SpecError, match=r"secrets\.A: .*NOPE") as unset:
        inline_secrets({"secrets": {"A": "v-$NOPE"}}, {})
    assert "v-" not in str(unset.value)
    with pytest.raises(SpecError, match=r"secrets\.L: must be a string") as listed:
        inline_secrets({"secrets": {"L": ["hidden-value"]}}, {})
    assert "hidden-value" not in str(listed.value)


def test_the_hosts_spec_names_each_secret_without_its_value() -> None:
    spec = {"name": "n", "secrets": {"INLINE": "s3cr3t", "FROM_SHELL": None}}
    moved = host_spec(spec, "/h/submissions/abc")
    assert moved["secrets"] == {"INLINE": None, "FROM_SHELL": None}
    assert spec["secrets"]["INLINE"] == "s3cr3t", "the input changed"


def _host_with_orch(tmp_path: Path, body: str) -> HostLayout:
    layout = HostLayout(str(tmp_path / "root"))
    bin_dir = Path(layout.path("venv/bin"))
    bin_dir.mkdir(parents=True)
    (bin_dir / "orch").write_text(f"#!/bin/sh\n{body}\n")
    (bin_dir / "orch").chmod(0o755)
    Path(layout.env).write_text(env_file_text(layout, {}))
    return layout


def test_one_command_submits_with_the_secrets_in_orchs_environment_and_no_file(
    tmp_path: Path,
) -> None:
    """The secrets reach the host's `orch submit` environment from stdin; no file is left, the
    spec's copy goes once orch took the job, and a refused submit takes its folder along."""
    layout = _host_with_orch(
        tmp_path,
        'ls -A "$(dirname "$2")" | tr "\\n" " "; '
        'printf "|%s|%s|%s" "$TOKEN" "$*" "$(umask)"; exit ${CODE:-0}',
    )
    folder = layout.submission("0123456789ab")
    os.makedirs(f"{folder}/work")
    Path(f"{folder}/job.yaml").write_text("name: n\n")
    secret = "va'l $(id) ue"
    command = submit_command(layout, folder, ["--detach"])
    assert secret not in command
    done = subprocess.run(["sh", "-c", command], input=secrets_text({"TOKEN": secret}),
                          capture_output=True, text=True, timeout=30)  # fmt: skip
    assert done.returncode == 0, done.stderr
    seen, token, args, umask = done.stdout.split("|")
    assert seen.split() == ["job.yaml", "work"], "a secrets file was written beside the spec"
    assert (token, args, umask) == (secret, f"submit {folder}/job.yaml --detach", "0077")
    assert sorted(os.listdir(folder)) == ["work"]  # the spec's copy went, the workdir stays

    Path(f"{folder}/job.yaml").write_text("name: n\n")
    refused = subprocess.run(["sh", "-c", f"CODE=2; export CODE; {command}"], input="",
                             capture_output=True, text=True, timeout=30)  # fmt: skip
    assert refused.returncode == 2
    assert not os.path.exists(folder), "a submission no orch took is left on the host"


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


def test_host_spec_leaves_a_bucket_source_as_written() -> None:
    bucket = {"src": "s3://bkt/imagenet", "dst": "~/imagenet"}
    spec = {"name": "n", "workdir": ".", "data": [bucket, {"src": "d1", "dst": "~/d"}]}
    moved = host_spec(spec, "/h/submissions/abc")
    assert moved["data"] == [bucket, {"src": "/h/submissions/abc/data/1", "dst": "~/d"}]
    assert is_bucket_item(bucket) and not is_bucket_item({"src": "./s3"})
    assert not is_bucket_item("s3://bkt")  # not a mapping: the spec's check names it


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
