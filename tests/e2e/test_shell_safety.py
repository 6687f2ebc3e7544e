"""Hostile text in `run`, `setup`, `env` and paths reaches a real node exactly.

One job on a real local node (sshd, rsync, torchrun) whose workdir name, data destination and
checkpoint directory hold quotes, `$`, `;`, backticks, spaces and unicode, and whose run
command, setup command and environment carry the same and newlines too. The run command
echoes back what it got (its argv, its environment, the data file, the setup's output, its
working directory) into the checkpoint directory; the pulled copy is compared byte for byte.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml

from tests.support.helpers import (
    assert_nothing_left,
    job_json,
    orch_env,
    run_orch,
    submitted_job_id,
)

pytestmark = pytest.mark.e2e

VALUES = [
    "with space",
    "it's",
    'say "hi"',
    "$HOME ${PATH} $(id -u) `id -u`",
    "a;b && c || d | e",
    "new\nline",
    "tab\there",
    "back\\slash",
    "üñí ☃ 日本",
    "*?[a]{b,c}~#!",
    "-n",
    "<in >out 2>&1",
    "'\"$`\\;\n mixed",
    "",
]
NAME = "wörk $x;`y` 'q\" dir"  # one hostile piece for file and directory names

ECHO_BACK = """\
import json, os, sys
out = os.environ["ORCH_CHECKPOINT_DIR"]
data = os.path.expanduser(sys.argv[1])
with open(os.path.join(data, "payload.txt"), "rb") as handle:
    payload = handle.read().decode()
with open(os.path.expanduser("~/setup.out"), "rb") as handle:
    setup = handle.read().decode()
seen = {
    "argv": sys.argv[2:],
    "env": {k: v for k, v in os.environ.items() if k.startswith("V_")},
    "payload": payload,
    "setup": setup,
    "cwd": os.getcwd(),
    "checkpoint_dir": out,
}
tmp = os.path.join(out, ".tmp-echo")
with open(tmp, "w", encoding="utf-8") as handle:
    json.dump(seen, handle, ensure_ascii=False)
os.replace(tmp, os.path.join(out, "echo.json"))
with open(os.path.join(out, "argv.bin"), "wb") as handle:
    handle.write(b"\\0".join(a.encode() for a in sys.argv[2:]))
print("echoed", len(sys.argv) - 2, "arguments", flush=True)
"""


def test_hostile_run_setup_env_and_paths_reach_the_node_exactly(tmp_path: Path) -> None:
    workdir = tmp_path / NAME
    workdir.mkdir()
    (workdir / "echo_back.py").write_text(ECHO_BACK)
    data = tmp_path / f"data {NAME}"
    data.mkdir()
    (data / "payload.txt").write_text("\n".join(VALUES))
    dst = f"~/dst {NAME}"
    spec = {
        "name": "shell-safety",
        "workdir": f"./{NAME}",
        "data": [{"src": f"./data {NAME}", "dst": dst}],
        "setup": shlex.join(["printf", "%s", VALUES[-2]]) + ' > "$HOME/setup.out"',
        "run": shlex.join(["python", "echo_back.py", dst, *VALUES]),
        "resources": {"nodes": 1, "gpus_per_node": 1},
        "checkpoint": {"dir": f"ck {NAME}", "pull_every": 2},
        # $$ is a literal $ in an env value (a bare $NAME would be this shell's NAME)
        "env": {f"V_{i}": value.replace("$", "$$") for i, value in enumerate(VALUES)},
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec, allow_unicode=True, sort_keys=False))

    env = orch_env(tmp_path / "orch")
    result = run_orch(["submit", str(path)], env, timeout=400)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    job_id = submitted_job_id(output)

    mirror = tmp_path / "orch" / "jobs" / job_id / "checkpoints"
    seen = json.loads((mirror / "echo.json").read_text(encoding="utf-8"))
    assert seen["argv"] == VALUES
    assert (mirror / "argv.bin").read_bytes() == b"\0".join(v.encode() for v in VALUES)
    assert seen["env"] == {f"V_{i}": value for i, value in enumerate(VALUES)}
    assert seen["payload"] == "\n".join(VALUES)
    assert seen["setup"] == VALUES[-2]
    assert seen["cwd"].endswith(f"/orch-jobs/{job_id}/workdir")
    assert seen["checkpoint_dir"] == f"{seen['cwd']}/ck {NAME}"
    assert "echoed 14 arguments" in output

    job = job_json(job_id, env)
    assert job["state"] == "SUCCEEDED"
    assert_nothing_left(job)
