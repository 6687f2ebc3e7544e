"""`orch report` and `orch status --watch` on one short real job.

The job runs on two local nodes whose nvidia-smi is the replay stand-in (so GPU samples are
recorded), priced so that it has a bill. While it runs, one `status --watch` follows it to the
end and another is interrupted with Ctrl-C; once it is over, its report is drawn as a PNG and
as an HTML page.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import numpy
import pytest
from PIL import Image

from orchestrator.config import Settings
from orchestrator.ledger.store import Ledger, make_engine
from orchestrator.providers.local.provider import LocalProvider
from tests.support.helpers import (
    Background,
    install_gpu_stand_in,
    job_json,
    orch_env,
    run_orch,
    wait_for_state,
)
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e

PLANTED = '<script>alert("x")</script> & <b>bold</b>'
RUN_SECONDS = 5


def _end_leftovers(home: Path) -> None:
    """Kill the job's controllers and end its nodes, should a step below have failed."""
    for pid_file in home.glob("jobs/*/controller.pid"):
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
    provider = LocalProvider(Settings(home=home))
    leftovers = [node.instance_id for node in provider.list_owned()]
    if leftovers:
        provider.terminate(leftovers)


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    base = tmp_path_factory.mktemp("report")
    (base / "work").mkdir()
    node_bin = base / "node-bin"
    install_gpu_stand_in(node_bin, json.dumps({"mode": "normal", "gpus": [[87, 30000, 81559]]}))
    spec = base / "job.yaml"
    spec.write_text(
        "name: report\nworkdir: work\n"
        "run: python hold.py\n"
        "data: [{src: node-bin, dst: ~/bin}]\n"
        "resources: {nodes: 2, gpus_per_node: 1}\n"
        # A budget the job shows spend against, wide enough that a loaded machine's slow
        # start never reaches it before the test lets the run end.
        "budget: {max_cost_usd: 2.00}\n"
    )
    # The run lasts RUN_SECONDS at least, and until the test has seen node 1's new reading
    # recorded: under load, a fixed run could end before the reading changed.
    (base / "work" / "hold.py").write_text(
        "import os, time\n"
        "start = time.monotonic()\n"
        f"while time.monotonic() - start < {RUN_SECONDS} or not os.path.exists("
        "os.path.expanduser('~/go')):\n"
        "    time.sleep(0.2)\n"
    )
    home = base / "orch"
    env = orch_env(
        home, ORCH_WATCH_INTERVAL="1", ORCH_GPU_SAMPLE_EVERY="1", ORCH_LOCAL_PRICE_PER_HOUR="0.36"
    )
    try:
        submitted = run_orch(["submit", str(spec), "--detach"], env, timeout=120)
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        job_id = submitted.stdout.split()[-1]
        started = time.monotonic()
        watcher = Background(["status", job_id, "--watch", "--interval", "0.5"], env)
        # Started as `orch status JOB --watch &` in a script starts it: Ctrl-C's SIGINT ignored.
        leaver = Background(
            ["status", job_id, "--watch", "--interval", "0.5"], env, sigint_ignored=True
        )
        # Node 1's GPU gets busy at another level, so the nodes' lines differ.
        job = wait_for_state(job_id, env, {"RUNNING"}, timeout=120)
        node_1 = next(lease for lease in job["leases"] if lease["rank"] == 1)["instance_id"]
        trace = home / "local" / "nodes" / node_1 / "disk" / "bin" / "nvidia-smi.trace"
        trace.with_suffix(".tmp").write_text(
            json.dumps({"mode": "normal", "gpus": [[45, 9000, 81559]]})
        )
        trace.with_suffix(".tmp").replace(trace)
        leaver.wait_for("watching", timeout=60)
        leaver.proc.send_signal(signal.SIGINT)
        left_code = leaver.finish(timeout=30)
        state_after_leaving = job_json(job_id, env)["state"]
        wait_until(
            lambda: any(
                (g["node"], g["util_pct"]) == (1, 45) for g in job_json(job_id, env)["gpus"]
            ),
            "node 1's new GPU reading recorded", timeout=120, interval=0.5,
        )  # fmt: skip
        now = job_json(job_id, env)
        assert now["state"] == "RUNNING", (now["state"], now["events"])
        for lease in job["leases"]:
            (home / "local" / "nodes" / lease["instance_id"] / "disk" / "go").touch()
        watch_code = watcher.finish(timeout=240)
        watch_seconds = time.monotonic() - started
        state_after_watch = job_json(job_id, env)["state"]
        # A ledger string a page must not run: events carry free text from nodes and users.
        Ledger(make_engine(home / "orch.db")).add_event(job_id, "WARNING", PLANTED)
        yield {
            "base": base,
            "home": home,
            "env": env,
            "job_id": job_id,
            "watch": (watch_code, watcher.output, watch_seconds, state_after_watch),
            "left": (left_code, leaver.output, state_after_leaving),
        }
    finally:
        _end_leftovers(home)


def test_watch_follows_the_job_to_its_end_and_prints_the_final_view(finished: dict) -> None:
    code, output, seconds, state = finished["watch"]
    assert code == 0, output
    assert state == "SUCCEEDED"  # it returned only once the job was final
    assert seconds >= RUN_SECONDS  # so it kept watching while the job ran
    assert finished["job_id"] in output
    assert "SUCCEEDED" in output
    for part in ("spend", "GPU utilization", "events"):
        assert part in output, output
    # The final view holds the latest GPU reading of each node.
    readings = re.findall(r"^\W*([01])\W+0\W+(\d+)\W", output, flags=re.MULTILINE)
    assert sorted(set(readings)) == [("0", "87"), ("1", "45")], output


def test_ctrl_c_stops_watching_and_leaves_the_job_running(finished: dict) -> None:
    code, output, state = finished["left"]
    assert code == 130, output
    assert f"job {finished['job_id']} goes on" in output
    # Still running, or (on a loaded machine, the 5 s run may be over by the time the
    # watcher has stopped) finished by itself: never cancelled by the watcher's Ctrl-C.
    assert state in {"PENDING", "PROVISIONING", "SYNCING", "RUNNING", "SUCCEEDED"}
    events = job_json(finished["job_id"], finished["env"])["events"]
    assert not [e for e in events if e["kind"] == "CANCELLED"], events


def test_png_report_draws_the_finished_job(finished: dict) -> None:
    env, job_id = finished["env"], finished["job_id"]
    result = run_orch(["report", job_id, "--json"], env, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    document = json.loads(result.stdout)
    path = Path(document["path"])
    assert path == finished["home"] / "jobs" / job_id / "report.png"
    assert document["series"] == 2  # one GPU on each of the two nodes
    assert document["samples"] >= 4
    assert document["markers"] >= 2  # RUNNING and SUCCEEDED at least

    image = Image.open(path)
    assert image.format == "PNG"
    width, height = image.size
    assert 800 <= width <= 3000 and 500 <= height <= 3000
    pixels = numpy.asarray(image.convert("RGB"), dtype=numpy.int16).reshape(-1, 3)
    drawn = int((pixels != 255).any(axis=1).sum())
    colored = int((pixels.max(axis=1) - pixels.min(axis=1) > 80).sum())
    assert drawn > 0.03 * len(pixels)  # axes, text, lines: not a blank canvas
    assert colored > 1500  # the utilization and spend lines and the event markers
    assert len(numpy.unique(pixels, axis=0)) > 50

    out = finished["base"] / "elsewhere" / "job.png"
    plain = run_orch(["report", job_id, "--out", str(out)], env, timeout=120)
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.strip() == str(out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_html_report_embeds_the_picture_and_escapes_ledger_strings(finished: dict) -> None:
    env, job_id = finished["env"], finished["job_id"]
    result = run_orch(["report", job_id, "--html"], env, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    path = Path(result.stdout.strip())
    assert path == finished["home"] / "jobs" / job_id / "report.html"
    page = path.read_text()

    assert job_id in page
    embedded = re.search(r'<img [^>]*src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert embedded is not None
    image = Image.open(io.BytesIO(base64.b64decode(embedded.group(1))))
    assert image.format == "PNG" and image.size[0] >= 800

    events = page[page.index("<h2>events</h2>") :]
    for kind in ("PROVISIONING", "RUNNING", "SUCCEEDED", "TERMINATED"):
        assert f"<td>{kind}</td>" in events
    assert "<td>SUCCEEDED</td>" in page[: page.index("<h2>leases</h2>")]  # the job's state
    assert page.count("<td>local</td>") >= 1
    # The planted string is shown as text, never as markup.
    assert "<script" not in page.lower()
    assert "<b>bold</b>" not in page
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &lt;b&gt;bold&lt;/b&gt;" in page


def test_watch_and_report_refuse_bad_input(tmp_path: Path) -> None:
    env = orch_env(tmp_path / "orch")
    cases = [
        ["status", "some-job", "--watch", "--json"],
        ["status", "--watch"],
        ["status", "some-job", "--interval", "1"],
        ["status", "some-job", "--watch", "--interval", "0"],
        ["status", "no-such-job", "--watch"],
        ["report", "no-such-job"],
    ]
    for args in cases:
        result = run_orch(args, env, timeout=60)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert "error:" in result.stderr, (args, result.stderr)
    both = run_orch(["status", "some-job", "--watch", "--json"], env, timeout=60)
    assert "--json" in both.stderr and "--watch" in both.stderr
