"""Two ORCH_HOMEs on one ledger (a PostgreSQL database, then one SQLite file by URL) race for
the same fleet slots: each home is a process of its own with its own engine, several threads
in each read the free slots, place a job and claim its nodes (in any order), all at once, for
a couple of seconds.
Whatever the interleaving, no slot is ever held by two claims at once: the shared marker
every winner sets under a lock finds no slot set already, the ledger never shows two held
claims of one slot, and the losers were refused (None) rather than granted."""

from __future__ import annotations

import json
import multiprocessing
import random
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from orchestrator.config import load_settings
from orchestrator.ledger.fleets import Fleet, FleetBook, FleetHost, NodeClaim
from orchestrator.ledger.store import Ledger, ledger_engine, make_engine
from orchestrator.providers.ssh.placement import place
from tests.support.helpers import fast_env

HOSTS, GPUS = 2, 2  # four slots, so every claim collides with some other
THREADS = 4  # per home
RACE_S = 1.5
T0 = datetime(2026, 3, 1, tzinfo=UTC)


def _race(env: dict[str, str], home: int, markers: Any, lock: Any, out: Any, start: Any) -> None:
    """One ORCH_HOME: THREADS threads claiming and releasing for RACE_S seconds."""
    ledger = Ledger(ledger_engine(load_settings(env)))
    book = FleetBook(ledger)
    tally: dict[str, Any] = {"won": 0, "refused": 0, "double": 0, "errors": []}
    count = threading.Lock()

    def worker(thread: int) -> None:
        try:
            claiming(thread)
        except Exception as exc:  # a deadlock or any other failure fails the test
            with count:
                tally["errors"].append(repr(exc))

    def claiming(thread: int) -> None:
        me = home * 100 + thread + 1
        rng = random.Random(me)
        start.wait()
        deadline = time.monotonic() + RACE_S
        round_ = 0
        while time.monotonic() < deadline:
            round_ += 1
            nodes, per_node = rng.choice([(1, 1), (1, 2), (2, 1)])
            placed = place(book.host_slots("lab"), ranks=range(nodes), slots_per_node=per_node)
            if placed is None:
                continue
            job = f"h{home}-t{thread}-{round_}"
            claims = [NodeClaim(p.rank, p.host_id, p.slots, f"{job}-{p.rank}") for p in placed]
            rng.shuffle(claims)  # nodes in any order: the claims must not deadlock
            got = book.claim("lab", job, f"home-{home}", claims, datetime.now(UTC))
            if got is None:
                with count:
                    tally["refused"] += 1
                continue
            keys = [(c.host_id, c.slot) for c in got]
            with lock:
                taken = [markers[_index(key)] for key in keys]
                for key in keys:
                    markers[_index(key)] = me
            time.sleep(rng.random() * 0.002)
            with lock:  # cleared before the ledger frees the slots: no false alarm
                for key in keys:
                    markers[_index(key)] = 0
            book.release([c.instance_id for c in claims], datetime.now(UTC))
            with count:
                tally["won"] += 1
                tally["double"] += sum(1 for held in taken if held)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ledger.engine.dispose()
    out.put(tally)


HOST_IDS: list[int] = []


def _index(key: tuple[int, int]) -> int:
    return HOST_IDS.index(key[0]) * GPUS + key[1]


def test_two_homes_never_hold_one_slot_at_once(url: str, tmp_path: Path) -> None:
    engine = make_engine(url)
    book = FleetBook(Ledger(engine))
    gpus = json.dumps([{"index": i, "name": "NVIDIA A100", "memory_mib": 81920} for i in range(2)])
    book.add(
        Fleet(name="lab", identity="/k", price_per_hour="1", owner="ana", created_at=T0),
        [
            FleetHost(
                fleet="",
                position=0,
                user="root",
                address=f"10.0.0.{n}",
                host_key="k",
                gpus=gpus,
                cpus=8,
                memory_mib=1,
                disk_free_gb=1.0,
                checked_at=T0,
            )
            for n in range(HOSTS)
        ],  # fmt: skip
    )
    HOST_IDS[:] = [h.id for h in book.get("lab")[1]]  # type: ignore[misc]
    engine.dispose()  # the children fork without the parent's connections

    context = multiprocessing.get_context("fork")
    markers, lock, out = context.Array("i", HOSTS * GPUS), context.Lock(), context.Queue()
    start = context.Barrier(2 * THREADS)
    homes = [
        context.Process(
            target=_race,
            args=(fast_env(tmp_path / name, ORCH_DATABASE_URL=url), i, markers, lock, out, start),
        )
        for i, name in enumerate(("a", "b"))
    ]
    for home in homes:
        home.start()
    for home in homes:
        home.join(60)
    assert [home.exitcode for home in homes] == [0, 0]
    tallies = [out.get(timeout=5) for _ in homes]
    assert [t["errors"] for t in tallies] == [[], []]
    assert sum(t["double"] for t in tallies) == 0, tallies
    assert all(t["won"] > 0 for t in tallies), tallies  # both homes got slots
    assert sum(t["refused"] for t in tallies) > 0, tallies  # and they did collide

    engine = make_engine(url)
    try:
        assert FleetBook(Ledger(engine)).held() == []  # every winner released what it held
    finally:
        engine.dispose()
