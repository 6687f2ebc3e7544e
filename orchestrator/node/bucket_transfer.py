"""Many objects at once, and parts of large ones at once: the transfers of `bucket-data`
(`orchestrator.node.bucket_data`).

Part of the node runtime: standard library only, Python 3.8 or newer; boto3 is imported by
`open_client` alone. One s3transfer manager runs every object of a fetch or an upload with
`concurrency` threads (objects and their parts share them). Each download is given the size
and ETag the listing said, so no HeadObject is spent per object and a multipart download asks
for that version only (IfMatch). At most `4 x concurrency` transfers are in flight, so the
files open at once stay bounded whatever the object count. Progress lines come from the
calling thread, at most once a second.
"""

from __future__ import annotations

import binascii
import contextlib
import os
import threading
import time

if __package__:
    import orchestrator.node.bucket_plan as bp
else:  # the program on a node: its modules are beside it
    import bucket_plan as bp

PROGRESS_EVERY_S = 1.0
PART_BYTES = 8 * 1024 * 1024
PART_MARK = ".orch-part-"
_NEW_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC


def open_client(request: dict) -> tuple[object, Transfers]:
    """The S3 client and the transfers for `request` (endpoint_url, region, credentials,
    concurrency). No boto3: `Refused` of kind `boto3`."""
    try:
        import boto3
        from boto3.s3.transfer import BaseSubscriber, TransferConfig, create_transfer_manager
        from botocore.config import Config
    except ImportError:
        raise bp.Refused(
            "boto3 is not installed on this node: use an image with boto3, or add "
            "`pip install boto3` to the job's setup", "boto3") from None  # fmt: skip
    concurrency = request.get("concurrency")
    if not isinstance(concurrency, int) or isinstance(concurrency, bool):
        concurrency = 16
    concurrency = max(1, min(concurrency, 128))
    creds = request.get("credentials")
    creds = creds if isinstance(creds, dict) else {}
    session = boto3.session.Session(
        aws_access_key_id=creds.get("access_key_id"),
        aws_secret_access_key=creds.get("secret_access_key"),
        aws_session_token=creds.get("session_token"),
        region_name=request.get("region") or None,
    )
    client = session.client(
        "s3",
        endpoint_url=request.get("endpoint_url") or None,
        config=Config(retries={"max_attempts": 5, "mode": "standard"},
                      max_pool_connections=concurrency + 4),
    )  # fmt: skip
    config = TransferConfig(
        multipart_threshold=PART_BYTES, multipart_chunksize=PART_BYTES,
        max_concurrency=concurrency, use_threads=True,
    )  # fmt: skip
    manager = create_transfer_manager(client, config)
    return client, Transfers(manager, _subscriber(BaseSubscriber), 4 * concurrency)


def _subscriber(base: type) -> type:
    class Watch(base):  # type: ignore[misc, valid-type]
        """Gives s3transfer the size and ETag we know, counts bytes, calls `finish` at the end."""

        def __init__(self, run: _Run, size: int, etag: str | None, finish) -> None:  # noqa: ANN001
            self.run, self.size, self.etag, self.finish = run, size, etag, finish

        def on_queued(self, future, **kwargs) -> None:  # noqa: ANN001, ANN003
            future.meta.provide_transfer_size(self.size)
            if self.etag and hasattr(future.meta, "provide_object_etag"):
                future.meta.provide_object_etag(self.etag)

        def on_progress(self, future, bytes_transferred, **kwargs) -> None:  # noqa: ANN001, ANN003
            self.run.add(bytes_transferred)

        def on_done(self, future, **kwargs) -> None:  # noqa: ANN001, ANN003
            self.finish(future)

    return Watch


class _Run:
    """One batch of transfers: counters, the bound on those in flight, the first failure and
    the progress lines (`emit`), with `tick` called as often (the manifest's write)."""

    def __init__(self, total: int, count: int, emit, tick=None) -> None:  # noqa: ANN001
        self.cond = threading.Condition()
        self.in_flight = self.bytes = self.objects = 0
        self.total, self.count = total, count
        self.failure: BaseException | None = None
        self.emit, self.tick = emit, tick
        self.last = time.monotonic()

    def add(self, n: int) -> None:
        with self.cond:
            self.bytes += n

    def ended(self, failure: BaseException | None) -> None:
        with self.cond:
            self.in_flight -= 1
            if failure is None:
                self.objects += 1
            elif self.failure is None:
                self.failure = failure
            self.cond.notify_all()

    def room(self, limit: int) -> bool:
        """Wait until fewer than `limit` are in flight and count one more; False once one failed."""
        with self.cond:
            while self.in_flight >= limit and self.failure is None:
                self.cond.wait(0.2)
                self._report()
            if self.failure is not None:
                return False
            self.in_flight += 1
            return True

    def wait(self, futures: list) -> BaseException | None:
        """Wait for what is in flight, cancelled once one failed; the first failure."""
        cancelled = False
        with self.cond:
            while self.in_flight > 0:
                if self.failure is not None and not cancelled:
                    cancelled = True
                    for future in futures:
                        future.cancel()
                self.cond.wait(0.2)
                self._report()
            return self.failure

    def _report(self) -> None:
        now = time.monotonic()
        if now - self.last < PROGRESS_EVERY_S:
            return
        self.last = now
        self.emit({"progress": {"bytes": self.bytes, "total": self.total,
                                "objects": self.objects, "of": self.count}})  # fmt: skip
        if self.tick is not None:
            self.tick()


def part_stem(name: str) -> str:
    """The start of the names of `name`'s downloads in progress; 12 hex digits follow."""
    return f".{name[:200]}{PART_MARK}"


def new_part(fd: int, name: str) -> tuple[str, int]:
    """A new file beside `name` in the folder `fd` for its download: (its name, descriptor)."""
    tmp = part_stem(name) + binascii.hexlify(os.urandom(6)).decode()
    return tmp, os.open(tmp, _NEW_FLAGS, 0o644, dir_fd=fd)


class Transfers:
    def __init__(self, manager, watch: type, limit: int) -> None:  # noqa: ANN001
        self.manager, self.watch, self.limit = manager, watch, limit

    def download_all(self, bucket: str, items: list, place, whole, emit, tick):  # noqa: ANN001, ANN201
        """Download each (rel, key, (etag, size)) of `items`: `place(rel)` gives its folder's
        descriptor and file name; it goes to a new file beside that name, renamed over it when
        whole, and `whole(rel, record)` is called (from a transfer thread). The first failure
        stops the rest and is returned (None when all arrived)."""
        run = _Run(sum(size for _, _, (_, size) in items), len(items), emit, tick)
        futures: list = []

        def finish(rel: str, size: int, etag: str, fd: int, name: str, tmp: str, f, future):  # noqa: ANN001, ANN202
            try:
                future.result()
                f.flush()
                st = os.fstat(f.fileno())
                if st.st_size != size:
                    raise OSError(f"{bp.bounded(rel)} changed while it was downloaded: fetch again")
                os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
            except BaseException as exc:  # noqa: BLE001 - the first failure is reported
                _discard(f, fd, tmp)
                return run.ended(exc)
            f.close()
            whole(rel, {"etag": etag, "size": size, "local_size": st.st_size,
                        "mtime_ns": st.st_mtime_ns})  # fmt: skip
            run.ended(None)

        for rel, key, (etag, size) in items:
            if not run.room(self.limit):
                break
            try:
                fd, name = place(rel)
                tmp, part = new_part(fd, name)
                f = os.fdopen(part, "wb")
            except BaseException as exc:  # noqa: BLE001
                run.ended(exc)
                break

            def done(future, args=(rel, size, etag, fd, name, tmp, f)):  # noqa: ANN001, ANN202
                finish(*args, future)

            try:
                futures.append(self.manager.download(
                    bucket, key, f, subscribers=[self.watch(run, size, etag, done)]))  # fmt: skip
            except BaseException as exc:  # noqa: BLE001 - refused before it was queued
                _discard(f, fd, tmp)
                run.ended(exc)
        return run.wait(futures)

    def upload_all(self, bucket: str, items: list, emit):  # noqa: ANN001, ANN201
        """Upload each (path, key, size) of `items`, the file opened without following a
        symlink; the first failure stops the rest and is returned."""
        run = _Run(sum(size for _, _, size in items), len(items), emit)
        futures: list = []
        for path, key, size in items:
            if not run.room(self.limit):
                break
            try:
                f = os.fdopen(os.open(path, _READ_FLAGS), "rb")
            except OSError as exc:
                run.ended(exc)
                break

            def done(future, f=f):  # noqa: ANN001, ANN202
                f.close()
                try:
                    future.result()
                except BaseException as exc:  # noqa: BLE001
                    return run.ended(exc)
                run.ended(None)

            try:
                futures.append(self.manager.upload(
                    f, bucket, key, subscribers=[self.watch(run, size, None, done)]))  # fmt: skip
            except BaseException as exc:  # noqa: BLE001 - refused before it was queued
                f.close()
                run.ended(exc)
        return run.wait(futures)

    def close(self) -> None:
        self.manager.shutdown()


def _discard(f, fd: int, tmp: str) -> None:  # noqa: ANN001
    f.close()
    with contextlib.suppress(OSError):
        os.unlink(tmp, dir_fd=fd)
