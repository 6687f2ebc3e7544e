"""The checkpoint agent: runs detached on every node of a job and makes checkpoints safe to copy.

The `checkpoint-agent` program of the node runtime (`orchestrator.node.runtime`), which holds
the modules it imports beside it (`MODULES`). orch starts it (`watch`) after the sync and
before the run. It looks at the job's checkpoint directory every `interval_s` seconds and
stages what the run writes there:

- A file is staged when its current version has no copy yet and `checkpoint_capture.decide`
  says so: a zip (what `torch.save` writes) or a `.safetensors` file at the first look where
  it is a finished write, whatever the quiet time; any other file once the agent has seen it
  unchanged for `quiet_s` (its size, mtime, ctime and inode, on looks that far apart: a file's
  mtime alone can lag a truncation by a fraction of a second); every file at once when the
  run has ended. So a file saved every second is captured too, however busy the node.
- A staged copy is kept only if the file did not change while it was copied: the same inode,
  size, mtime and ctime before and after, decided here, on the node; a zip file must also be
  whole entry by entry (every CRC-32), a `.safetensors` file hold what its header says
  (`checkpoint_copy.stage`). So a staged copy is never torn and never mixes two writes, however
  often the script saves in place.
- Files of a directory checkpoint (under `step-N/`, a DCP `.metadata`, DCP shards `__R_I.distcp`,
  a directory holding `COMPLETE` or `.metadata`) are written once, so they are staged as hard
  links, and so is a file whose new versions arrive renamed over it. Any other file is copied
  (a reflink where the filesystem can), because scripts rewrite such files in place. A linked
  copy that changes later is dropped and staged again.
- Staged copies live in `<state>/objects/<name>`. The previous copy of a file is kept until
  the one after it is staged.
- Files present when the agent first started are left alone while unchanged: what orch synced
  (code, configs) and the checkpoints orch put back (`restored` in the config, which are
  reported as staged without a copy). So are temporaries (`.tmp*`, `*.tmp`), `__pycache__`,
  `*.pyc`, `*.egg-info` and `.git`. Symlinks are never followed. A file whose name holds a
  control character, or is too long (`refused_name`), is not taken: the manifest's problems
  say so.
- A file rewritten again and again with no copy taken (`checkpoint_capture.History.uncaptured`)
  is listed in the manifest's `uncaptured`, with its rewrite interval and since when none
  was taken, for the controller to warn about.

After every change it replaces `<state>/manifest.json` atomically and appends the new
generation number to `<state>/events`, which the controller follows. With a store configured,
every staged copy is uploaded (`checkpoint_uploads`), and the manifest says which are stored.
Once the run has ended, the agent stages what is left, finishes its uploads, writes
`"done": true` and exits.

`restore` (run by the controller before a start) downloads files from the store into the
checkpoint directory (`checkpoint_restore`).

Stdlib only, Python 3.8 or newer (boto3 for an `s3://` store); it never imports torch.

    python3 orch-node-<version>.pyz checkpoint-agent watch --config agent.json
    python3 orch-node-<version>.pyz checkpoint-agent restore < plan.json
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import sys
import threading
import time

if __package__:
    from orchestrator.node.checkpoint_capture import (
        QUIET_S,
        TAKE,
        TRY,
        UNCAPTURED_MIN_S,
        WAIT,
        History,
        decide,
    )
    from orchestrator.node.checkpoint_copy import CHANGED, NOT_WHOLE, stage
    from orchestrator.node.checkpoint_dcp import dcp_files
    from orchestrator.node.checkpoint_files import (
        COMPLETE_MARKER,
        DCP_METADATA,
        home_path,
        identity,
        scan,
        shown,
        version_of,
        written_once,
    )
    from orchestrator.node.checkpoint_restore import restore
    from orchestrator.node.checkpoint_uploads import Uploads
    from orchestrator.node.checkpoint_whole import finished
    from orchestrator.node.node_kit import dumps, write_file
else:  # the program on a node: its modules are beside it
    from checkpoint_capture import QUIET_S, TAKE, TRY, UNCAPTURED_MIN_S, WAIT, History, decide
    from checkpoint_copy import CHANGED, NOT_WHOLE, stage
    from checkpoint_dcp import dcp_files
    from checkpoint_files import (
        COMPLETE_MARKER,
        DCP_METADATA,
        home_path,
        identity,
        scan,
        shown,
        version_of,
        written_once,
    )
    from checkpoint_restore import restore
    from checkpoint_uploads import Uploads
    from checkpoint_whole import finished
    from node_kit import dumps, write_file

MODULES = (
    "checkpoint_capture.py",
    "checkpoint_copy.py",
    "checkpoint_dcp.py",
    "checkpoint_files.py",
    "checkpoint_restore.py",
    "checkpoint_stores.py",
    "checkpoint_uploads.py",
    "checkpoint_whole.py",
    "node_kit.py",
)  # in the node runtime beside this file (`orchestrator.node.runtime`)
MANIFEST_VERSION = 1
MANIFEST = "manifest.json"
EVENTS = "events"
BASELINE = "baseline.json"
OBJECTS = "objects"
INTERVAL_S = 0.5
POLL_S = 0.05  # between two looks, how often a file being saved is asked whether it is done
NO_RUN_EXIT_S = 3600.0  # no run was started this long after the agent: nobody wants it


def _write_json(path: str, document: object, mode: int = 0o644) -> None:
    write_file(path, dumps(document), mode)


class Agent:
    """The `watch` loop. Single-threaded but for uploads, which report back under `lock`.

    Config (JSON): `job_id`, `checkpoint_dir`, `run_dir`, `state_dir`, `exclude`, `quiet_s`,
    `interval_s`, `store`, `restored`; `take_at_look` (default true: a finished zip or
    safetensors file is tried at every look; false keeps to the quiet rule alone) and
    `uncaptured_min_s` (see `checkpoint_capture`)."""

    def __init__(self, config: dict) -> None:
        self.config = config
        self.root = os.path.abspath(home_path(config["checkpoint_dir"]))
        self.state_dir = home_path(config["state_dir"])
        self.run_dir = home_path(config["run_dir"])
        self.objects = os.path.join(self.state_dir, OBJECTS)
        self.quiet_s = float(config.get("quiet_s", QUIET_S))
        self.interval_s = float(config.get("interval_s", INTERVAL_S))
        self.take_at_look = config.get("take_at_look", True) is not False
        self.uncaptured_min_s = float(config.get("uncaptured_min_s", UNCAPTURED_MIN_S))
        self.exclude = {os.path.abspath(home_path(p)) for p in config.get("exclude", [])}
        self.exclude.add(os.path.abspath(self.state_dir))
        os.makedirs(self.objects, exist_ok=True)
        self.lock = threading.Lock()
        self.files: dict[str, dict] = {}  # path -> {"size", "mtime_ns", "staged", ...}
        self.older: dict[str, list[str]] = {}  # path -> previous staged objects (newest last)
        self.dcp: dict[str, dict] = {}
        self.histories: dict[str, History] = {}  # path -> its versions as the looks saw them
        self.uncaptured: dict[str, dict] = {}  # path -> {"every_s", "since_ns", "ever"}
        # Files being saved at the last look (their format tells when a save is finished), by
        # path, with their looks then: the agent looks again as soon as one is finished.
        self.awaited: dict[str, tuple[int, ...]] = {}
        self._finished_now: dict[str, bool | None] = {}  # `_finished`'s answers this pass
        self.problems: dict[str, str] = {}
        self.generation = 0
        self.dirty = True
        self.started = time.time()
        self.uploads = Uploads(self, config.get("store"), config["job_id"], self.objects)
        self.ended_at: float | None = None
        self.scan_s = 0.0  # how long the last walk of the checkpoint directory took
        self.stage_s = 0.0  # and how long the staging after it took
        self.baseline = self._load_baseline()
        self._resume_manifest()

    # baseline: what was there before the run (synced, or put back by orch)
    def _load_baseline(self) -> dict[str, list[int]]:
        path = os.path.join(self.state_dir, BASELINE)
        try:
            with open(path) as handle:
                return {k: list(v) for k, v in json.load(handle).items()}
        except (OSError, ValueError):
            pass
        restored = self.config.get("restored") or {}
        baseline: dict[str, list[int]] = {}
        for rel, info in scan(self.root, self.exclude).items():
            known = restored.get(rel)
            if known is not None and int(known.get("size", -1)) == info.st_size:
                self.files[rel] = {
                    "size": info.st_size,
                    "mtime_ns": info.st_mtime_ns,
                    "staged": {
                        "digest": known["digest"], "size": info.st_size,
                        "mtime_ns": info.st_mtime_ns, "object": None, "linked": False,
                        "stored": known.get("key"), "restored": True,
                    },
                }  # fmt: skip
            else:
                baseline[rel] = version_of(info)
        _write_json(path, baseline)
        return baseline

    def _resume_manifest(self) -> None:
        """An agent started again (the node rebooted, a controller re-armed it) keeps what the
        last one staged, where its objects are still there."""
        try:
            with open(os.path.join(self.state_dir, MANIFEST)) as handle:
                manifest = json.load(handle)
        except (OSError, ValueError):
            return
        self.generation = int(manifest.get("generation", 0))
        for rel, entry in (manifest.get("files") or {}).items():
            staged = entry.get("staged")
            kept = staged.get("object") if staged else None
            if kept and not os.path.exists(os.path.join(self.objects, kept)):
                entry["staged"] = None
            self.files.setdefault(rel, entry)
        self.dcp = manifest.get("dcp") or {}

    def run_ended(self) -> bool:
        if os.path.exists(os.path.join(self.run_dir, "exit_code")):
            return True
        try:
            with open(os.path.join(self.run_dir, "pid")) as handle:
                pid = int(handle.read().strip())
        except (OSError, ValueError):
            return time.time() - self.started > NO_RUN_EXIT_S
        try:
            with open(f"/proc/{pid}/stat") as handle:
                return handle.read().rsplit(")", 1)[1].split()[0] == "Z"
        except (OSError, IndexError):
            return True

    def loop(self) -> None:
        while True:
            if not os.path.isdir(self.state_dir):
                return  # the job's directory was removed: nothing left to do
            ended = self.run_ended()
            if ended and self.ended_at is None:
                self.ended_at = time.time()
            settled = self.pass_once(ended=ended)
            if ended and settled and self.uploads.settled(self.ended_at):
                self.write_manifest(done=True)
                return
            if self.dirty:
                self.write_manifest(done=False)
            self._rest()

    def _rest(self) -> None:
        """Wait until the next look: `interval_s`, or sooner when a file being saved at the
        last look is a finished write (asked every `POLL_S`, by its looks and its last bytes
        alone), so its copy starts right after the save. Looking costs: a huge directory is
        looked at less often (at most a tenth of the time spent walking it), and the agent
        rests at least as long as its last staging took, so that copying checkpoints saved
        nonstop takes at most half a core."""
        began = time.monotonic()
        until = began + max(self.interval_s, 10 * self.scan_s, self.stage_s)
        earliest = began + max(10 * self.scan_s, self.stage_s)
        while (left := until - time.monotonic()) > 0:
            time.sleep(min(POLL_S, left))
            if time.monotonic() >= earliest and self._saved_since():
                return

    def _saved_since(self) -> bool:
        """Whether a file awaited since the last look changed and is a finished write now."""
        for rel, looks in self.awaited.items():
            try:
                info = os.lstat(os.path.join(self.root, *rel.split("/")))
            except OSError:
                continue
            if identity(info) != looks and self._finished(rel):
                return True
        return False

    def pass_once(self, *, ended: bool) -> bool:
        """One look at the checkpoint directory; True when nothing is left to stage."""
        began = time.monotonic()
        refused: dict[str, str] = {}
        found = scan(self.root, self.exclude, refused)
        self._note_refused(refused)
        now_ns, now = time.time_ns(), time.monotonic()
        self.scan_s = now - began
        settled = True
        self.awaited = {}
        self._finished_now = {}
        with self.lock:
            for rel in [r for r in self.files if r not in found]:
                self._forget(rel)
            for rel in [r for r in self.histories if r not in found]:
                del self.histories[rel]
            marked = {
                rel.rsplit("/", 1)[0] if "/" in rel else ""
                for rel in found
                if rel.rsplit("/", 1)[-1] in (COMPLETE_MARKER, DCP_METADATA)
            }
        for rel, info in sorted(found.items(), key=lambda kv: kv[0].endswith(DCP_METADATA)):
            version = version_of(info)
            with self.lock:
                if self.baseline.get(rel) == version and rel not in self.files:
                    continue
                history = self.histories.get(rel)
                if history is None:
                    history = self.histories[rel] = History(info, now)
                else:
                    history.look(info, now)
                entry = self.files.setdefault(rel, {"size": None, "mtime_ns": None,
                                                    "staged": None})  # fmt: skip
                if [entry["size"], entry["mtime_ns"]] != version:
                    entry["size"], entry["mtime_ns"] = version
                    entry.pop("rejected", None)
                    self.dirty = True
                self._check_link(rel, entry)
                staged = entry["staged"]
                if staged is not None and [staged["size"], staged["mtime_ns"]] == version:
                    continue
                if entry.get("rejected") == version:
                    continue  # stable, but not whole: it will not get better by waiting
            how = decide(
                history, info, now=now, now_ns=now_ns, quiet_s=self.quiet_s, ended=ended,
                finished=functools.partial(self._finished, rel),
            )  # fmt: skip
            if how == WAIT:
                settled = False
                if self._finished_now.get(rel) is False:  # a save in progress
                    self.awaited[rel] = identity(info)
                continue
            link = written_once(rel, marked) or history.linkable
            self._stage(rel, entry, history, link=link, quiet=how == TAKE)
            with self.lock:
                staged = entry["staged"]
                if staged is None or [staged["size"], staged["mtime_ns"]] != version:
                    settled = False
                    if how == TRY:  # a save began during the copy
                        self.awaited[rel] = identity(info)
        self.stage_s = time.monotonic() - now
        self._note_uncaptured(ended)
        self.uploads.queue()
        return settled

    def _finished(self, rel: str) -> bool | None:
        """Whether the file looks like a finished write now (`checkpoint_whole.finished`);
        False when taking at a look is switched off."""
        answer = self.take_at_look and finished(
            os.path.join(self.root, *rel.split("/")), rel.rsplit("/", 1)[-1]
        )
        self._finished_now[rel] = answer
        return answer

    def _note_refused(self, refused: dict[str, str]) -> None:
        """Files left alone for their names are a problem the controller shows."""
        text = None
        if refused:
            first = sorted(refused)[:3]
            named = ", ".join(f"{shown(rel, 80)} ({refused[rel]})" for rel in first)
            more = f" and {len(refused) - len(first)} more" if len(refused) > len(first) else ""
            text = f"not taken as checkpoints: {named}{more}"
        with self.lock:
            if self.problems.get("names") != text:
                if text is None:
                    self.problems.pop("names", None)
                else:
                    self.problems["names"] = text
                self.dirty = True

    def _note_uncaptured(self, ended: bool) -> None:
        """Files rewritten again and again without a copy go to the manifest's `uncaptured`;
        a new manifest is due when that list changes (not when their figures do)."""
        now, now_ns = time.monotonic(), time.time_ns()
        found: dict[str, dict] = {}
        with self.lock:
            for rel, history in self.histories.items() if not ended else ():
                every = history.uncaptured(now, self.uncaptured_min_s)
                if every is not None and rel in self.files:
                    found[rel] = {
                        "every_s": round(every, 2),
                        "since_ns": now_ns - int((now - history.uncaptured_since) * 1e9),
                        "ever": history.captured_at is not None,
                    }
            if set(found) != set(self.uncaptured):
                self.dirty = True
            self.uncaptured = found

    def _check_link(self, rel: str, entry: dict) -> None:
        """A linked copy shares its inode with the file: a rewrite in place changed it too (its
        size or mtime; not its ctime, which a new version renamed over the file moves too)."""
        staged = entry["staged"]
        if not staged or not staged.get("linked"):
            return
        try:
            info = os.lstat(os.path.join(self.objects, staged["object"]))
            intact = [info.st_size, info.st_mtime_ns] == [staged["size"], staged["mtime_ns"]]
        except OSError:
            intact = False
        if not intact:
            self._drop_object(staged["object"])
            entry["staged"] = None
            self.dirty = True

    def _stage(self, rel: str, entry: dict, history: History, *, link: bool, quiet: bool) -> None:
        """Stage the file's current version. A copy refused because the file was being
        written is dropped without a word unless the file was `quiet` (then it is a problem:
        waiting will not make it whole)."""
        result = stage(os.path.join(self.root, *rel.split("/")), rel, self.objects, link=link,
                       tag=f"{os.getpid()}")  # fmt: skip
        with self.lock:
            if isinstance(result, str):
                if not quiet and result in (CHANGED, NOT_WHOLE):
                    return  # being written: the next look tries again
                if result == NOT_WHOLE:
                    entry["rejected"] = [entry["size"], entry["mtime_ns"]]
                    self.problems[f"whole:{rel}"] = f"{rel}: {result}"
                elif result.startswith("staging failed"):
                    self.problems["staging"] = f"{rel}: {result}"
                self.dirty = True
                return
            history.captured(time.monotonic())
            self.problems.pop("staging", None)
            self.problems.pop(f"whole:{rel}", None)
            previous = entry["staged"]
            if previous is not None and previous.get("object"):
                if previous["object"] == result["object"]:
                    previous = None  # the same content again: the object was replaced in place
                else:
                    self.older.setdefault(rel, []).append(previous["object"])
            for old in self.older.get(rel, [])[:-1]:  # keep one previous copy
                self._drop_object(old)
            self.older[rel] = self.older.get(rel, [])[-1:]
            entry["staged"] = result
            self.dirty = True
            if rel.rsplit("/", 1)[-1] == DCP_METADATA:
                self._read_dcp(rel, result)

    def _read_dcp(self, rel: str, staged: dict) -> None:
        directory = rel.rsplit("/", 1)[0] if "/" in rel else ""
        try:
            with open(os.path.join(self.objects, staged["object"]), "rb") as handle:
                files = dcp_files(handle.read())
        except OSError:
            files = None
        self.dcp[directory] = {"metadata_digest": staged["digest"], "files": files}

    def _forget(self, rel: str) -> None:
        entry = self.files.pop(rel)
        staged = entry.get("staged")
        if staged and staged.get("object"):
            self._drop_object(staged["object"])
        for old in self.older.pop(rel, []):
            self._drop_object(old)
        if rel.rsplit("/", 1)[-1] == DCP_METADATA:
            self.dcp.pop(rel.rsplit("/", 1)[0] if "/" in rel else "", None)
        self.dirty = True

    def _drop_object(self, name: str | None) -> None:
        if name:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.objects, name))

    def write_manifest(self, *, done: bool) -> None:
        with self.lock:
            self.generation += 1
            document = {
                "version": MANIFEST_VERSION,
                "generation": self.generation,
                "written_at_ns": time.time_ns(),
                "pid": os.getpid(),
                "done": done,
                "run_ended": self.ended_at is not None,
                "files": self.files,
                "dcp": self.dcp,
                "problems": sorted(self.problems.values()),
                "uncaptured": self.uncaptured,
            }
            _write_json(os.path.join(self.state_dir, MANIFEST), document)
            self.dirty = False
        with open(os.path.join(self.state_dir, EVENTS), "a") as events:
            events.write(f"{self.generation}\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="checkpoint_agent")
    commands = parser.add_subparsers(dest="command", required=True)
    watch = commands.add_parser("watch")
    watch.add_argument("--config", required=True)
    commands.add_parser("restore")
    args = parser.parse_args(argv)
    if args.command == "restore":
        return restore(json.load(sys.stdin), sys.stdout)
    with open(args.config) as handle:
        config = json.load(handle)
    with contextlib.suppress(OSError):
        os.nice(10)  # training comes first
    Agent(config).loop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
