"""A job's checkpoints in the ledger, and what its store keeps of them.

Every complete checkpoint version is written once (`CheckpointRecord`: its files, their digests
and store keys, its step) when the mirror or the store first holds it whole; it is marked
pruned once neither does. The store's retention (`orchestrator.cluster.checkpoints.retention`) is
applied here too: versions no rule keeps are deleted from the store by the controller (the
nodes only ever upload), and at the job's end what no kept version uses is swept.

Every store key used here, to restore from or to delete, is computed from the job's prefix and
a file's checked path and digest (`StoreKeys`), also for records written before that rule:
a key a node named is never used.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import datetime

from orchestrator.cluster.checkpoints.collector import Collected
from orchestrator.cluster.checkpoints.kept_summary import Kept, newest_kept
from orchestrator.cluster.checkpoints.mirror import CheckpointMirror
from orchestrator.cluster.checkpoints.pulled_events import Arrival, Due, PullThrottle
from orchestrator.cluster.checkpoints.retention import StoredVersion, keys_to_delete, retire
from orchestrator.cluster.checkpoints.store import StoreClient, describe, open_client
from orchestrator.cluster.checkpoints.units import LATEST_POINTER, Unit, present_directories
from orchestrator.config import Settings
from orchestrator.errors import OrchError
from orchestrator.ledger.rebuilt import REBUILT_EVENT
from orchestrator.ledger.store import CheckpointRecord, Ledger, utcnow
from orchestrator.node.checkpoint_protocol import RestoreItem, StoreKeys, is_digest, safe_path


@dataclass(frozen=True)
class Newest:
    """The newest complete directory checkpoint: its name and step."""

    name: str
    step: int | None


@dataclass(frozen=True)
class StorePlan:
    """What a restart downloads from the store: the newest stored directory checkpoint (its
    name, step and version; None when there is none) and the newest version of every single
    file."""

    items: list[RestoreItem]
    name: str | None
    step: int | None
    version: str | None = None


class CheckpointRecords:
    """The ledger side of one job's checkpoints. `line` tells a human what arrived."""

    def __init__(
        self,
        *,
        job_id: str,
        store: str | None,
        mirror: CheckpointMirror,
        ledger: Ledger,
        settings: Settings,
        line: Callable[[str], None],
    ) -> None:
        self.job_id = job_id
        self.store = store
        self.mirror = mirror
        self.ledger = ledger
        self.settings = settings
        self.line = line
        self.keys = StoreKeys.of(store, job_id) if store is not None else None
        self.region: str | None = None  # the nodes' region, once known: the store's default
        self._client: StoreClient | None = None
        self._client_opened = False
        # What a restart moved aside on the nodes (`set_aside`): the store keeps its versions
        # as if the nodes still held them, and the job's end leaves its objects there.
        self.set_aside: set[str] = set()
        self.throttle = PullThrottle()  # single files: an event per minute, not per version

    # --- reading ----------------------------------------------------------------------------
    def newest(self, skip: Collection[tuple[str, str]] = ()) -> Newest | None:
        """The newest complete directory checkpoint kept anywhere (the mirror or the store),
        but the versions in `skip` ((name, version) pairs)."""
        candidates = []
        held = self.mirror.newest_directory(skip=skip)
        if held is not None:
            candidates.append(Newest(held.name, held.step))
        for record in self.ledger.checkpoints(self.job_id, live_only=True):
            if (
                record.kind in ("step", "dcp")
                and record.stored_at is not None
                and (record.name, record.digest) not in skip
            ):
                candidates.append(Newest(record.name, record.step))
        if not candidates:
            return None
        return max(candidates, key=lambda n: -1 if n.step is None else n.step)

    def kept(self, skip: Collection[tuple[str, str]] = ()) -> list[Kept]:
        """The newest directory checkpoint and the newest version of each single file the
        ledger holds live (`kept_summary.newest_kept`), but the versions in `skip`."""
        return newest_kept(self.ledger.checkpoints(self.job_id, live_only=True), skip)

    def store_plan(self, skip: Collection[tuple[str, str]] = ()) -> StorePlan | None:
        """What to download from the store on a restart (never a version in `skip`, nor one
        the ledger does not hold complete); None when nothing is stored."""
        records = [
            r
            for r in self.ledger.checkpoints(self.job_id, live_only=True)
            if r.stored_at is not None and r.files_json
        ]
        directories = [
            r for r in records if r.kind in ("step", "dcp") and (r.name, r.digest) not in skip
        ]
        chosen: list[CheckpointRecord] = []
        name: str | None = None
        step: int | None = None
        version: str | None = None
        if directories:
            best = max(directories, key=lambda r: (-1 if r.step is None else r.step, r.id or 0))
            chosen.append(best)
            name, step, version = best.name, best.step, best.digest
        singles: dict[str, CheckpointRecord] = {}
        for record in records:
            if record.kind == "file":
                singles[record.name] = record  # ordered by id: the newest wins
        chosen.extend(singles.values())
        items = [item for record in chosen for item in self._restore_items(record)]
        return StorePlan(items, name, step, version) if items else None

    def _stored_files(self, record: CheckpointRecord) -> list[tuple[dict, str | None]]:
        """Each file of a record with the key the controller computes for it (None: not
        stored, or a path or digest that cannot be one of the job's keys)."""
        found = []
        for f in json.loads(record.files_json or "[]"):
            key = None
            path, digest = f.get("path"), f.get("digest")
            if self.keys is not None and f.get("key") and safe_path(path) and is_digest(digest):
                key = self.keys.key(path, digest)
            found.append((f, key))
        return found

    def _restore_items(self, record: CheckpointRecord) -> list[RestoreItem]:
        """What restores `record` from the store: every file, or nothing when one of them has
        no key (the checkpoint would not be whole)."""
        files = self._stored_files(record)
        if any(key is None for _f, key in files):
            return []
        return [RestoreItem(f["path"], key, int(f["size"]), f["digest"]) for f, key in files if key]

    def _keys(self, record: CheckpointRecord) -> frozenset[str]:
        return frozenset(key for _f, key in self._stored_files(record) if key is not None)

    # --- writing ----------------------------------------------------------------------------
    def record(self, collected: Collected, ranks: Collection[int]) -> None:
        """Write what `collected` found complete, then mark and retire what is no longer kept.
        `ranks` are the cluster's nodes (for what they still hold)."""
        now = utcnow()
        known = {
            (r.name, r.digest): r for r in self.ledger.checkpoints(self.job_id, live_only=True)
        }
        installed = {(u.name, u.version) for u in collected.installed}
        for unit in collected.complete:
            if unit.name == LATEST_POINTER:
                continue
            key = (unit.name, unit.version)
            in_mirror = key in installed or self.mirror.holds_unit(unit)
            stored = self.store is not None and unit.stored
            record = known.get(key)
            if record is None:
                if not (in_mirror or stored):
                    continue
                record = self.ledger.add_checkpoint(self._new(unit, now, in_mirror, stored))
                known[key] = record
                self._announce(unit, "pulled" if in_mirror else "stored", record.step)
                continue
            fields: dict[str, object] = {}
            if stored and record.stored_at is None:
                fields.update(stored_at=now, files_json=files_json(unit))
                self._announce(unit, "stored", record.step)
            if in_mirror and not record.in_mirror:
                fields["in_mirror"] = True
            if fields and record.id is not None:
                known[key] = self.ledger.update_checkpoint(record.id, **fields)
        present = present_directories(collected.manifests, ranks)
        if present is not None:
            present |= self.set_aside
        self._drop_gone(known, present, now)

    def _new(self, unit: Unit, now: datetime, in_mirror: bool, stored: bool) -> CheckpointRecord:
        return CheckpointRecord(
            job_id=self.job_id,
            name=unit.name,
            step=self._step(unit),
            size_bytes=unit.size_bytes,
            pulled_at=now,
            kind=unit.kind,
            digest=unit.version,
            in_mirror=in_mirror,
            stored_at=now if stored else None,
            store_url=self.store,
            files_json=files_json(unit),
        )

    def _step(self, unit: Unit) -> int | None:
        """A checkpoint's step: the one its name gives; for a single file without one, the
        step the run has reported by now (the job's row), which its contents may trail."""
        if unit.step is not None or unit.kind != "file":
            return unit.step
        return self.ledger.get_job(self.job_id).step

    def _announce(self, unit: Unit, how: str, step: int | None) -> None:
        """A CHECKPOINT event for a version that arrived: each directory checkpoint's, a
        single file's coalesced (`pulled_events`)."""
        arrival = Arrival(how, unit.name, unit.size_bytes, step, self.store)
        if unit.kind != "file":
            self._write(Due(arrival, 1, None))
        elif (due := self.throttle.offer(arrival, utcnow())) is not None:
            self._write(due)

    def flush_events(self) -> None:
        """Write the events of single-file versions held back (`PullThrottle`): at a run's end,
        so that the newest version has its event."""
        for due in self.throttle.flush():
            self._write(due)

    def _write(self, due: Due) -> None:
        self.ledger.add_event(self.job_id, "CHECKPOINT", due.message, step=due.arrival.step)
        self.line(f"[orch] checkpoint {due.message}")

    def _drop_gone(
        self,
        known: dict[tuple[str, str | None], CheckpointRecord],
        present: set[str] | None,
        now: datetime,
    ) -> None:
        """Mark what the mirror no longer holds, retire store versions no rule keeps, and
        prune records neither keeps."""
        retired = self._retire(list(known.values()), present)
        for (name, version), record in known.items():
            if record.id is None:
                continue
            held = self.mirror.units().get(name)
            in_mirror = held is not None and held.version == version
            in_store = record.stored_at is not None and record.id not in retired
            fields: dict[str, object] = {}
            if record.in_mirror and not in_mirror:
                fields["in_mirror"] = False
            if record.id in retired:
                fields["stored_at"] = None
            if not in_mirror and not in_store:
                fields["pruned_at"] = now
            if fields:
                self.ledger.update_checkpoint(record.id, **fields)

    def _retire(self, records: list[CheckpointRecord], present: set[str] | None) -> set[int]:
        """Delete from the store the versions no rule keeps; their record ids."""
        client = self._store_client()
        if client is None:
            return set()
        versions = [
            StoredVersion(
                record.id, record.name, record.kind or "file", record.step, self._keys(record)
            )
            for record in records
            if record.stored_at is not None and record.id is not None
        ]
        retired = retire(versions, present=present)
        doomed = keys_to_delete(versions, retired)
        if doomed:
            try:
                client.delete(doomed)
            except OrchError as exc:
                self.ledger.add_event(self.job_id, "WARNING", f"store cleanup: {exc}")
                return set()
        return retired

    def _rebuilt(self) -> bool:
        return any(e.kind == REBUILT_EVENT for e in self.ledger.events(self.job_id))

    def _store_client(self) -> StoreClient | None:
        if not self._client_opened and self.store is not None:
            self._client_opened = True
            try:
                self._client = open_client(self.store, self.settings, self.job_id, self.region)
            except Exception as exc:  # noqa: BLE001 - a store we cannot prune is no job failure
                self.ledger.add_event(self.job_id, "WARNING", f"store cleanup disabled: {exc}")
        return self._client

    def sweep_store(self) -> None:
        """At the job's end: delete what the job uploaded that no kept version uses (versions
        superseded meanwhile, or never complete).

        A job rebuilt on a new controller host (`ledger.rebuilt`) lost its records of what was
        uploaded before: there only objects of versions this ledger recorded are deleted, and
        the rest is kept (it may be the only copy of a lost node's shards), with an event."""
        client = self._store_client()
        if client is None or self.store is None or self.keys is None:
            return
        records = self.ledger.checkpoints(self.job_id)
        kept = {
            key
            for record in records
            if record.stored_at is not None and record.pruned_at is None
            for key in self._keys(record)
        }
        known = {key for record in records for key in self._keys(record)}
        rebuilt = self._rebuilt()
        prefix = self.keys.base
        try:
            leftover = set(client.keys()) - kept
            aside = {key for key in leftover if self._under_set_aside(key)}
            leftover -= aside
            odd = {key for key in leftover if not self.keys.owns(key)}
            unknown = {key for key in leftover - odd if key not in known} if rebuilt else set()
            client.delete(leftover - odd - unknown)
        except OrchError as exc:
            self.ledger.add_event(self.job_id, "WARNING", f"store cleanup: {exc}")
            return
        if unknown:
            self.ledger.add_event(
                self.job_id, "STORE", f"kept {len(unknown)} object(s) under "
                f"{describe(self.store, prefix)} that this ledger has no record of: the job was "
                "rebuilt on a new controller host, and its records of what was stored before "
                "died with the old one; remove them yourself once nothing needs them",
            )  # fmt: skip
        leftover -= unknown
        if leftover - odd:
            self.ledger.add_event(
                self.job_id, "STORE", f"removed {len(leftover - odd)} object(s) no kept "
                f"checkpoint uses (superseded, or never complete) from "
                f"{describe(self.store, prefix)}",
            )  # fmt: skip
        if aside:
            self.ledger.add_event(
                self.job_id, "STORE", f"kept {len(aside)} object(s) of checkpoints set aside "
                f"before a restart ({', '.join(sorted(self.set_aside)[:8])}) under "
                f"{describe(self.store, prefix)}; remove them yourself if unwanted",
            )  # fmt: skip
        if odd:
            self.ledger.add_event(
                self.job_id, "WARNING", f"left {len(odd)} object(s) under "
                f"{describe(self.store, prefix)} whose names orch does not delete (control "
                "characters, or not canonical paths); remove them yourself if unwanted",
            )  # fmt: skip

    def _under_set_aside(self, key: str) -> bool:
        """Whether a store key holds a file under an entry a restart set aside."""
        assert self.keys is not None
        head = self.keys.base + "/"
        if not self.set_aside or not key.startswith(head):
            return False
        path = key[len(head) :].rpartition("@")[0]
        return any(path == entry or path.startswith(entry + "/") for entry in self.set_aside)


def files_json(unit: Unit) -> str:
    """The files of a checkpoint as the ledger keeps them: path, digest, size, store key."""
    return json.dumps(
        [{"path": f.path, "digest": f.digest, "size": f.size, "key": f.stored} for f in unit.files]
    )
