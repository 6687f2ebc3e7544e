"""How the controller talks to a node's checkpoint agent: the commands it runs, what it reads back.

Pure: command text, the agent's config, and the parser of its manifest. The agent itself is
`orchestrator.node.checkpoint_agent`, the `checkpoint-agent` program of the node runtime
(`orchestrator.node.runtime`, put on the node once). On a node, under the home directory:

    orch-jobs/<job id>/checkpoint-agent/config.json   what `arm_command` wrote (0600: it may
                        hold store credentials)
    .../manifest.json   what is staged (see `NodeManifest`), replaced atomically
    .../events          one line per new manifest; the controller follows it
    .../objects/        the staged copies
    .../pid, agent.log  the detached agent

A manifest comes from a process the job's own scripts could tamper with, so the parser trusts
nothing in it: paths must be canonical relative paths, digests and object names hex, numbers
numbers. What does not fit is dropped. A path with a control character (a NUL, a newline, a
terminal escape) or too long is dropped with a `Notice` (a WARNING event of the job), and so is
a store key other than the one the controller computes (`StoreKeys`): the controller records,
restores from and deletes only keys it computed itself.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from orchestrator.node import checkpoint_agent, runtime
from orchestrator.node.checkpoint_capture import QUIET_S
from orchestrator.node.checkpoint_files import canonical, refused_name, shown, skipped, store_key
from orchestrator.node.checkpoint_stores import parse_store
from orchestrator.node.file_write import PRIVATE, write_file_command
from orchestrator.node.launch import NodeLayout, home_expr

_HEX64 = re.compile(r"[0-9a-f]{64}")  # fullmatch: `$` would let a trailing newline in
_CLOCK_LINE = re.compile(r"^([0-9]{1,30}) (alive|dead|none)$")
MAX_NOTICES = 20  # kept per manifest; the rest are counted in one more notice
MAX_UNCAPTURED = 20  # uncaptured files read per manifest (the first by path)


@dataclass(frozen=True)
class AgentLayout:
    """Where the agent of one job keeps its files on a node (home-relative paths)."""

    job_id: str

    @property
    def root(self) -> str:
        return f"{NodeLayout(self.job_id).root}/checkpoint-agent"

    @property
    def objects(self) -> str:
        return f"{self.root}/{checkpoint_agent.OBJECTS}"


@dataclass(frozen=True)
class StoreAccess:
    """How a node reaches the checkpoint store (`checkpoint.store`)."""

    url: str  # s3://bucket/prefix or file:///path
    endpoint_url: str | None = None  # S3 API endpoint other than AWS's (a sandbox, moto)
    region: str | None = None
    # Keys for providers whose nodes have no credentials of their own (local nodes); on AWS
    # the nodes use their instance profile and this stays None.
    credentials: Mapping[str, str] | None = None

    def document(self) -> dict[str, object]:
        return {
            "url": self.url,
            "endpoint_url": self.endpoint_url,
            "region": self.region,
            "credentials": dict(self.credentials) if self.credentials else None,
        }


@dataclass(frozen=True)
class StoreKeys:
    """How the controller names one job's objects in its store:
    `<prefix>/<job id>/<path>@<first 16 hex of its digest>` (`checkpoint_files.store_key`,
    the key the agent uploads to). Keys are computed from a file's checked path and digest,
    never taken from a node."""

    prefix: str  # the store URL's key prefix ('' for none)
    job_id: str

    @classmethod
    def of(cls, url: str, job_id: str) -> StoreKeys:
        _scheme, _where, prefix = parse_store(url)
        return cls(prefix, job_id)

    @property
    def base(self) -> str:
        """The job's key prefix, without the trailing '/'."""
        return "/".join(p for p in (self.prefix.strip("/"), self.job_id) if p)

    def key(self, path: str, digest: str) -> str:
        return store_key(self.prefix, self.job_id, path, digest)

    def owns(self, key: object) -> bool:
        """Whether `key` may be deleted or restored from for this job: a key under the job's
        prefix whose rest is a canonical relative path (no empty, `.` or `..` part, so not
        absolute) with no control character."""
        head = self.base + "/"
        if not isinstance(key, str) or not key.startswith(head) or self.base.startswith("/"):
            return False
        rest = key[len(head) :]
        return canonical(rest) and refused_name(key) is None


@dataclass(frozen=True)
class Notice:
    """What the controller refused from a node, for a WARNING event of the job: `about` names
    the thing refused (one event per `about`), `message` says what and why, printable."""

    about: str
    message: str


@dataclass(frozen=True)
class RestoredFile:
    """A checkpoint file orch put back on the node before the run: known, not staged again."""

    digest: str
    size: int
    key: str | None = None  # its store key, when it came from the store


@dataclass(frozen=True)
class AgentConfig:
    """What one node's agent is told when it is armed."""

    job_id: str
    rank: int
    checkpoint_dir: str  # home-relative or absolute (NodeLayout.node_path)
    store: StoreAccess | None = None
    restored: Mapping[str, RestoredFile] = field(default_factory=dict)
    quiet_s: float = QUIET_S
    interval_s: float = checkpoint_agent.INTERVAL_S
    node_owner: str = ""  # whose directories the node holds (a kept cluster's id); "": the job's

    def document(self) -> dict[str, object]:
        node = NodeLayout(self.node_owner or self.job_id)
        agent = AgentLayout(self.node_owner or self.job_id)
        exclude = [node.run_dir, agent.root]
        if not self.checkpoint_dir.startswith(node.root):
            exclude.append("orch-jobs")  # a home-wide checkpoint dir: orch's own tree is no part
        return {
            "job_id": self.job_id,
            "rank": self.rank,
            "checkpoint_dir": self.checkpoint_dir,
            "run_dir": node.run_dir,
            "state_dir": agent.root,
            "exclude": exclude,
            "quiet_s": self.quiet_s,
            "interval_s": self.interval_s,
            "store": self.store.document() if self.store else None,
            "restored": {
                path: {"digest": f.digest, "size": f.size, "key": f.key}
                for path, f in self.restored.items()
            },
        }


def folder_command(layout: AgentLayout) -> str:
    """Make the agent's folder (run with the runtime's check, when the agents are sent)."""
    return f"mkdir -p {home_expr(layout.root)}"


def arm_command(layout: AgentLayout) -> str:
    """Start the agent detached (stdin: the config as JSON); a no-op while one runs.

    The config is written 0600, since it may hold store credentials; it never appears in a
    command line."""
    root = home_expr(layout.root)
    watch = runtime.program_command("checkpoint-agent", "watch", "--config", "config.json")
    return "\n".join(
        [
            f"mkdir -p {root} && cd {root} || exit 2",
            'if [ -f pid ] && kill -0 "$(cat pid)" 2>/dev/null; then cat > /dev/null; exit 0; fi',
            "umask 077",
            f"{write_file_command(f'{layout.root}/config.json', PRIVATE)} || exit 2",
            "touch events",
            f"setsid nohup {watch} > agent.log 2>&1 < /dev/null &",
            "echo $! > pid",
        ]
    )


def read_command(layout: AgentLayout) -> str:
    """Print the node's clock (ns since the epoch) and whether the agent runs, then its
    manifest (nothing when there is none yet)."""
    root = home_expr(layout.root)
    return (
        f'cd {root} 2>/dev/null || {{ echo "$(date +%s%N) none"; exit 0; }}; '
        'if [ -f pid ] && kill -0 "$(cat pid)" 2>/dev/null; then s=alive; '
        "elif [ -f pid ]; then s=dead; else s=none; fi; "
        'echo "$(date +%s%N) $s"; cat manifest.json 2>/dev/null; true'
    )


def follow_command(layout: AgentLayout) -> str:
    """Print a line each time the agent writes a new manifest, until the channel closes."""
    root = home_expr(layout.root)
    return f"mkdir -p {root} && cd {root} && touch events && exec tail -n 0 -F events"


def restore_command(layout: AgentLayout) -> str:
    """Run the agent's `restore` (stdin: `restore_plan(...)`); see `parse_restore_output`."""
    root = home_expr(layout.root)
    return f"cd {root} && {runtime.program_command('checkpoint-agent', 'restore')}"


@dataclass(frozen=True)
class RestoreItem:
    path: str  # relative to the checkpoint directory
    key: str
    size: int
    digest: str


def restore_plan(checkpoint_dir: str, store: StoreAccess, items: Sequence[RestoreItem]) -> str:
    return json.dumps(
        {
            "checkpoint_dir": checkpoint_dir,
            "store": store.document(),
            "files": [
                {"path": i.path, "key": i.key, "size": i.size, "digest": i.digest} for i in items
            ],
        }
    )


def restore_error(output: str) -> str | None:
    """What a failed restore said (`error ...`), or None when it finished."""
    lines = output.strip().splitlines()
    if lines and lines[-1].startswith("restored "):
        return None
    errors = [line[6:] for line in lines if line.startswith("error ")]
    return errors[-1] if errors else (lines[-1] if lines else "the restore printed nothing")


# --- the manifest ----------------------------------------------------------------------------


@dataclass(frozen=True)
class StagedCopy:
    """One version of a file, as the agent staged it."""

    digest: str
    size: int
    mtime_ns: int  # the file's mtime when staged, on the node's clock
    ctime_ns: int  # and its ctime, when staged
    object: str | None  # name under objects/; None for a file orch restored (nothing to fetch)
    linked: bool  # a hard link to the file itself: valid only while the file is unchanged
    stored: str | None  # its store key once uploaded: the key the controller computed


@dataclass(frozen=True)
class NodeFile:
    """A file under the checkpoint directory of one node, as of the manifest."""

    path: str
    size: int
    mtime_ns: int
    staged: StagedCopy | None

    @property
    def settled(self) -> bool:
        """Staged, and unchanged since: what is on disk is what was staged."""
        staged = self.staged
        return staged is not None and (staged.size, staged.mtime_ns) == (self.size, self.mtime_ns)

    @property
    def usable(self) -> StagedCopy | None:
        """The staged copy, if it still holds what was staged: a copy always does; a link only
        while the file has not been written since."""
        staged = self.staged
        if staged is None or (staged.linked and not self.settled):
            return None
        return staged


@dataclass(frozen=True)
class DcpListing:
    """A DCP checkpoint directory as its staged `.metadata` describes it."""

    metadata_digest: str
    files: Mapping[str, int] | None  # shard name -> least size; None: the metadata was unreadable


@dataclass(frozen=True)
class Uncaptured:
    """A file the agent saw rewritten again and again without taking a copy of it."""

    every_s: float  # its rewrite interval, as the agent's looks saw it
    since_ns: int  # since when no copy was taken (the last one, or its first look), node clock
    ever: bool  # whether a copy of it was ever taken


@dataclass(frozen=True)
class NodeManifest:
    """What one node's agent reported. `clock_offset_ns` is the node's clock minus the
    controller's, measured when it was read; `files` mtimes are on the node's clock."""

    rank: int
    generation: int
    done: bool  # the run ended and the agent staged (and uploaded) what it left
    run_ended: bool
    files: Mapping[str, NodeFile]
    dcp: Mapping[str, DcpListing]
    problems: tuple[str, ...]  # the agent's own, printable
    clock_offset_ns: int = 0
    refused: tuple[Notice, ...] = ()  # what the parser dropped and tells about
    uncaptured: Mapping[str, Uncaptured] = field(default_factory=dict)  # at most MAX_UNCAPTURED


@dataclass(frozen=True)
class AgentReport:
    """The answer of `read_command`: the agent's state and its manifest (None: none yet)."""

    agent: str  # alive | dead | none
    manifest: NodeManifest | None


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _hex(value: object) -> str | None:
    return value if isinstance(value, str) and _HEX64.fullmatch(value) else None


def is_digest(value: object) -> bool:
    """Whether `value` is a file digest as the agent writes it (64 lowercase hex)."""
    return _hex(value) is not None


class _Reader:
    """Reads one manifest of node `rank`, keeping what it refused as notices."""

    def __init__(self, rank: int, keys: StoreKeys | None) -> None:
        self.rank = rank
        self.keys = keys
        self.notices: dict[str, Notice] = {}
        self.unlisted = 0

    def refuse(self, about: str, message: str) -> None:
        if about in self.notices:
            return
        if len(self.notices) < MAX_NOTICES:
            self.notices[about] = Notice(about, f"node {self.rank}: {message}")
        else:
            self.unlisted += 1

    def refused(self) -> tuple[Notice, ...]:
        notices = list(self.notices.values())
        if self.unlisted:
            notices.append(
                Notice(f"more:{self.rank}", f"node {self.rank}: the checkpoint manifest holds "
                       "more refused entries than are listed in events")
            )  # fmt: skip
        return tuple(notices)

    def path_ok(self, path: object) -> bool:
        """A path under the checkpoint directory; one orch refuses by its name is a notice."""
        if not isinstance(path, str):
            return False
        why = refused_name(path)
        if why is not None:
            self.refuse(f"path:{path}", f"checkpoint file '{shown(path)}' refused: {why}")
            return False
        return safe_path(path)

    def staged(self, path: str, value: object) -> StagedCopy | None:
        if not isinstance(value, dict):
            return None
        digest, size, mtime = (
            _hex(value.get("digest")),
            _int(value.get("size")),
            _int(value.get("mtime_ns")),
        )
        obj = value.get("object")
        ctime = _int(value.get("ctime_ns")) or 0
        if digest is None or size is None or mtime is None:
            return None
        if obj is not None and _hex(obj) is None:
            return None
        return StagedCopy(
            digest=digest,
            size=size,
            mtime_ns=mtime,
            ctime_ns=ctime,
            object=obj,
            linked=value.get("linked") is True,
            stored=self.stored(path, digest, value.get("stored")),
        )

    def stored(self, path: str, digest: str, claimed: object) -> str | None:
        """The store key of a copy the node says it uploaded: the computed one, never the
        node's. A claim of another key is ignored (the copy counts as not stored)."""
        if self.keys is None or claimed is None or claimed is False or claimed == "":
            return None
        computed = self.keys.key(path, digest)
        if claimed == computed:
            return computed
        self.refuse(
            f"key:{path}:{digest}",
            f"'{shown(path)}': its manifest names the store key '{shown(str(claimed)[:200])}', "
            f"not {computed!r}; ignored (orch computes the keys it keeps and deletes)",
        )
        return None

    def dcp(self, directory: str, listing: dict) -> DcpListing | None:
        digest = _hex(listing.get("metadata_digest"))
        if digest is None:
            return None
        shards = listing.get("files")
        if not isinstance(shards, dict):
            return DcpListing(digest, None)
        parsed: dict[str, int] = {}
        for name, least in shards.items():
            why = refused_name(name) if isinstance(name, str) else None
            if why is not None:
                # A shard orch would never take: the checkpoint can never be whole.
                self.refuse(
                    f"dcp:{directory}",
                    f"DCP checkpoint '{shown(directory or '.')}' refused: its .metadata names "
                    f"'{shown(name)}', and {why}",
                )
                return None
            if safe_path(name) and "/" not in name and _int(least) is not None:
                parsed[name] = least
        return DcpListing(digest, parsed)


def safe_path(path: object) -> bool:
    """Whether `path` may name a checkpoint file under the checkpoint directory (the node's,
    the mirror): a canonical relative path (no empty, `.` or `..` part, so not absolute), UTF-8,
    no name orch refuses (`checkpoint_files.refused_name`), no temporary or build output."""
    return isinstance(path, str) and canonical(path) and not skipped(path)


def parse_manifest(
    document: object, rank: int, clock_offset_ns: int = 0, keys: StoreKeys | None = None
) -> NodeManifest | None:
    """A manifest from its JSON document; None when it is not one. `keys`: the job's store
    keys (None without a store: no copy counts as stored)."""
    if (
        not isinstance(document, dict)
        or document.get("version") != checkpoint_agent.MANIFEST_VERSION
    ):
        return None
    reader = _Reader(rank, keys)
    files: dict[str, NodeFile] = {}
    raw_files = document.get("files")
    for path, entry in raw_files.items() if isinstance(raw_files, dict) else ():
        if not reader.path_ok(path) or not isinstance(entry, dict):
            continue
        size, mtime = _int(entry.get("size")), _int(entry.get("mtime_ns"))
        if size is None or mtime is None:
            continue
        files[path] = NodeFile(path, size, mtime, reader.staged(path, entry.get("staged")))
    dcp: dict[str, DcpListing] = {}
    raw_dcp = document.get("dcp")
    for directory, listing in raw_dcp.items() if isinstance(raw_dcp, dict) else ():
        if not (directory == "" or reader.path_ok(directory)) or not isinstance(listing, dict):
            continue
        parsed = reader.dcp(directory, listing)
        if parsed is not None:
            dcp[directory] = parsed
    problems = document.get("problems")
    raw_uncaptured = document.get("uncaptured")
    uncaptured: dict[str, Uncaptured] = {}
    for path in sorted(raw_uncaptured, key=str) if isinstance(raw_uncaptured, dict) else ():
        parsed_file = _uncaptured(raw_uncaptured[path])
        if parsed_file is not None and reader.path_ok(path):
            uncaptured[path] = parsed_file
            if len(uncaptured) >= MAX_UNCAPTURED:
                break
    return NodeManifest(
        rank=rank,
        generation=_int(document.get("generation")) or 0,
        done=document.get("done") is True,
        run_ended=document.get("run_ended") is True,
        files=files,
        dcp=dcp,
        problems=tuple(shown(str(p)[:500], 500) for p in problems[:20])
        if isinstance(problems, list)
        else (),
        clock_offset_ns=clock_offset_ns,
        refused=reader.refused(),
        uncaptured=uncaptured,
    )


def _uncaptured(value: object) -> Uncaptured | None:
    """One entry of a manifest's `uncaptured`, or None when it is not one."""
    if not isinstance(value, dict):
        return None
    every, since = value.get("every_s"), _int(value.get("since_ns"))
    if isinstance(every, bool) or not isinstance(every, (int, float)) or since is None:
        return None
    if not 0 < every < 1e7:  # NaN fails this too
        return None
    return Uncaptured(float(every), since, value.get("ever") is True)


def parse_report(
    output: str, rank: int, sent_ns: int, received_ns: int, keys: StoreKeys | None = None
) -> AgentReport:
    """Parse `read_command`'s output, read between `sent_ns` and `received_ns` (controller
    clock): the node's clock is taken to have been read half way. Output that is no report
    (however long, deep or odd) is an agent with no manifest, never an exception."""
    head, _, rest = output.partition("\n")
    clock = _CLOCK_LINE.match(head.strip())
    if clock is None:
        return AgentReport("none", None)
    offset = int(clock.group(1)) - (sent_ns + received_ns) // 2
    try:
        document = json.loads(rest) if rest.strip() else None
    except (ValueError, RecursionError):
        document = None
    return AgentReport(clock.group(2), parse_manifest(document, rank, offset, keys))
