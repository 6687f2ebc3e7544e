"""Planted secrets and the cluster's private key show up nowhere they should not.

A job runs on real local nodes while an AWS secret and a session token sit in the user's
environment and two tokens are the job's `secrets`: one listed in the spec without a value,
one given as `--secret NAME`, both taken from the submitting shell. While it runs, the command
line of every process on this machine is read, and the environment of the node's processes;
after it ends, every file under ORCH_HOME (the ledger with its WAL, logs, job record,
checkpoints) and the output of the read commands are searched. The secrets' values may exist
in exactly two places: `jobs/<id>/env.json` (0600) and the node's launch script (0700), and
they must reach the run command intact. The spec's `env` values are settings: they reach the
run too (one expanded from the shell, one given as `--env`) and show in the dry run and in
`orch status`. Keys are 0600 in a 0700 directory.
"""

from __future__ import annotations

import hashlib
import json
import stat
import uuid
from pathlib import Path

import pytest
import yaml

from tests.support.helpers import (
    job_json,
    orch_env,
    processes_with_marker,
    run_orch,
    wait_for_state,
)
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e

CHECK = """\
import hashlib, os, sys, time
got = {k: hashlib.sha256(os.environ.get(k, "").encode()).hexdigest() for k in sys.argv[1::2]}
ok = all(got[k] == v for k, v in zip(sys.argv[1::2], sys.argv[2::2]))
leaked = [k for k in ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN") if k in os.environ]
out = os.environ["ORCH_CHECKPOINT_DIR"]
with open(os.path.join(out, "verdict.txt"), "w") as handle:
    handle.write(f"spec env intact: {ok}; forwarded from the controller: {leaked}")
print("checked the environment", flush=True)
held_until = time.time() + 300  # the test lets it end once it has looked enough
while not os.path.exists("go") and time.time() < held_until:
    time.sleep(0.2)
"""


def _secret(kind: str) -> str:
    return f"planted-{kind}-{uuid.uuid4().hex}"


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _cmdlines() -> dict[int, bytes]:
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                found[int(entry.name)] = (entry / "cmdline").read_bytes()
            except OSError:
                continue
    return found


def test_no_secret_in_logs_ledger_status_or_process_arguments(tmp_path: Path) -> None:
    aws_secret, token = _secret("aws"), _secret("token")
    spec_secrets = {"WANDB_API_KEY": _secret("wandb"), "HF_TOKEN": _secret("hf")}
    settings = {"PLAIN": "plain-setting-shown", "LEVEL": "3"}
    home = tmp_path / "orch"
    env = orch_env(
        home, ORCH_LOCAL_PRICE_PER_HOUR="0.1", AWS_SECRET_ACCESS_KEY=aws_secret,
        AWS_SESSION_TOKEN=token, AWS_ACCESS_KEY_ID="AKIAPLANTED", PLAIN_PART="plain",
        **spec_secrets,
    )  # fmt: skip
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "check.py").write_text(CHECK)
    expected = {**spec_secrets, **settings}
    digests = [x for k, v in expected.items() for x in (k, hashlib.sha256(v.encode()).hexdigest())]
    spec = {
        "name": "secrets",
        "workdir": "work",
        "run": "python check.py " + " ".join(digests),
        "resources": {"nodes": 2, "gpus_per_node": 1},
        "env": {"PLAIN": "${PLAIN_PART}-setting-shown"},
        "secrets": {"HF_TOKEN": None},
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(spec))
    flags = ["--secret", "WANDB_API_KEY", "--env", "LEVEL=3"]
    dry = run_orch(
        ["submit", str(tmp_path / "job.yaml"), *flags, "--dry-run", "--json"], env, timeout=60
    )
    assert dry.returncode == 0, dry.stderr
    shown = json.loads(dry.stdout)["spec"]
    assert shown["secrets"] == {"HF_TOKEN": "(hidden)", "WANDB_API_KEY": "(hidden)"}
    assert shown["env"] == settings
    assert not any(v in dry.stdout for v in spec_secrets.values())
    result = run_orch(["submit", str(tmp_path / "job.yaml"), *flags, "--detach"], env, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    job_id = result.stdout.strip().splitlines()[-1]

    key_files = list(home.glob("keys/*/id_ed25519"))
    assert len(key_files) == 1
    key_body = [line for line in key_files[0].read_text().splitlines() if "PRIVATE KEY" not in line]
    needles = {
        "AWS secret": aws_secret.encode(),
        "session token": token.encode(),
        **{f"spec env {k}": v.encode() for k, v in spec_secrets.items()},
        **{f"private key line {i}": line.encode() for i, line in enumerate(key_body)},
    }

    # While it runs: no process's arguments hold a secret; nodes did not get the user's AWS env.
    running = wait_for_state(job_id, env, {"RUNNING"}, timeout=180)
    looked: list[dict] = []  # the job as each look found it

    def look_until_the_end() -> bool:
        job = job_json(job_id, env) if looked else running
        if looked and job["state"] != "RUNNING":
            return True
        for pid, cmdline in _cmdlines().items():
            for what, needle in needles.items():
                assert needle not in cmdline, f"{what} in the arguments of pid {pid}: {cmdline!r}"
        for lease in job["leases"]:
            for pid in processes_with_marker(lease["instance_id"]):
                try:
                    environ = Path(f"/proc/{pid}/environ").read_bytes()
                except OSError:
                    continue
                assert aws_secret.encode() not in environ and token.encode() not in environ
        looked.append(job)
        launch_scripts = list(home.glob(f"local/nodes/*/disk/orch-jobs/{job_id}/run/launch.sh"))
        for script in launch_scripts:
            assert _mode(script) == 0o700, script
        if len(looked) >= 3:  # enough looks while it ran, however slow each: it may end
            for workdir in home.glob(f"local/nodes/*/disk/orch-jobs/{job_id}/workdir"):
                (workdir / "go").touch()
        return False

    wait_until(look_until_the_end, "the run's end, looking at it", 300, interval=0.5)
    assert len(looked) >= 3
    wait_for_state(job_id, env, {"SUCCEEDED"}, timeout=180)

    # The run command saw the secrets and the env intact, and nothing forwarded from the
    # controller.
    verdict = (home / "jobs" / job_id / "checkpoints" / "verdict.txt").read_text()
    assert verdict == "spec env intact: True; forwarded from the controller: []"

    # Where the secrets are kept, and how tightly.
    keys_dir = key_files[0].parent
    assert _mode(keys_dir) == 0o700
    assert _mode(key_files[0]) == 0o600
    assert _mode(keys_dir / "known_hosts") == 0o600
    env_file = home / "jobs" / job_id / "env.json"
    assert _mode(env_file) == 0o600
    assert spec_secrets["HF_TOKEN"] in env_file.read_text()

    # Nothing else under ORCH_HOME holds them: ledger (and its WAL), logs, job record, mirror.
    searched = 0
    for path in home.rglob("*"):
        if not path.is_file() or path == env_file or keys_dir in path.parents:
            continue
        data = path.read_bytes()
        searched += 1
        for what, needle in needles.items():
            assert needle not in data, f"{what} in {path.relative_to(home)}"
    assert searched >= 5
    assert (home / "orch.db").exists() and (home / "jobs" / job_id / "job.json").exists()

    # The settings show in orch status; nor does what the read commands print hold a secret.
    assert job_json(job_id, env)["env"] == settings
    assert "PLAIN=plain-setting-shown, LEVEL=3" in run_orch(["status", job_id], env).stdout
    for args in (
        ["status", "--json"], ["status", job_id, "--json"], ["status", job_id], ["status"],
        ["cost", "--json"], ["logs", job_id], ["logs", job_id, "--node", "1"],
    ):  # fmt: skip
        shown = run_orch(args, env, timeout=60)
        assert shown.returncode == 0, shown.stderr
        for what, needle in needles.items():
            assert needle.decode() not in shown.stdout + shown.stderr, f"{what} in orch {args}"
