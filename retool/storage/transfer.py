"""Copy a directory between a PVC path and S3 (or PVC to PVC), verified, resumable and never half-present.

The destination counts as a complete copy only once its manifest is written, and the order of
writes keeps that true whenever the copy stops, even by SIGKILL:

- Upload: the destination's old manifest is deleted first; multipart uploads a killed earlier
  upload left open under the prefix are aborted; every file is hashed and objects carry their
  sha256 as metadata, so objects already holding the same bytes are skipped (a rerun resumes);
  verl's tracker files (``latest_checkpointed_iteration.txt``) go after every other file, and the
  manifest last.
- Download: the copy marker is written first and the old manifest and trackers removed, partial
  files a killed earlier download left are deleted, then each file lands in a temporary name
  beside its target, is verified against the source manifest and only then renamed into place
  (files already matching are skipped); trackers go after the shards, then the manifest, and
  the marker is removed last. A directory with the marker is no checkpoint
  (:func:`retool.storage.steps.latest_step`).
- Interruption: SIGTERM (a pod being deleted) and Ctrl-C cancel the transfers in flight; their
  partial files are deleted and their multipart uploads aborted before the error is raised.
  What SIGKILL leaves behind is cleaned up by the next copy into the same destination.
- Transfers are multipart above ``TransferSettings.multipart_threshold`` and retried: botocore
  retries each API call, and a file whose transfer still fails is retried as a whole.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, TypeVar

from retool.storage.location import LocalLocation, Location, S3Location, parse_location
from retool.storage.manifest import (
    COPY_MARKER,
    MANIFEST_NAME,
    PARTIAL_MARKER,
    SHA256_METADATA_KEY,
    ChecksumMismatchError,
    FileEntry,
    ManifestMissingError,
    build_manifest,
    dump_manifest,
    entries_under,
    is_partial_name,
    load_manifest,
    local_matches,
    sha256_file,
)
from retool.storage.s3 import TransferSettings, is_retryable, make_client
from retool.storage.steps import TRACKER_FILE

log = logging.getLogger(__name__)
T = TypeVar("T")

_COPY_CHUNK = 8 * 1024 * 1024


class TransferInterruptedError(RuntimeError):
    """The copy was stopped (SIGTERM, Ctrl-C) and cleaned up; the destination is not a complete copy."""


@dataclass
class TransferReport:
    source: str
    destination: str
    transferred: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    bytes_transferred: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def record(self, relative: str, size: int, copied: bool) -> None:
        with self._lock:
            if copied:
                self.transferred.append(relative)
                self.bytes_transferred += size
            else:
                self.skipped.append(relative)


class Cancellation:
    """Shared by the file workers of one copy: once set, no new work starts and transfers in flight stop."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._futures: set[Any] = set()

    @property
    def is_set(self) -> bool:
        return self._event.is_set()

    def check(self) -> None:
        if self._event.is_set():
            raise TransferInterruptedError("the copy was cancelled")

    @contextlib.contextmanager
    def tracking(self, future: Any) -> Iterator[None]:
        """Cancel ``future`` (an s3transfer TransferFuture) if the copy is cancelled while it runs."""
        with self._lock:
            self._futures.add(future)
            cancelled = self._event.is_set()
        if cancelled:
            future.cancel()
        try:
            yield
        finally:
            with self._lock:
                self._futures.discard(future)

    def set(self) -> None:
        with self._lock:
            self._event.set()
            futures = list(self._futures)
        for future in futures:  # s3transfer then deletes its temporary file / aborts its multipart upload
            with contextlib.suppress(Exception):
                future.cancel()


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """Within the block, SIGTERM raises TransferInterruptedError in the main thread (so cleanup runs).

    Only when called from the main thread and nobody else handles SIGTERM: a library must not take
    over a handler its caller installed.
    """
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def interrupt(signum: int, _frame: object) -> None:
        raise TransferInterruptedError(f"interrupted by signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def upload_dir(src: str, dst: str, *, client: Any = None, settings: TransferSettings | None = None, endpoint_url: str | None = None, region: str | None = None) -> TransferReport:
    """Copy local directory ``src`` to ``dst`` (``s3://bucket/prefix`` or another local path)."""
    if not isinstance(parse_location(src), LocalLocation):
        raise ValueError(f"upload source {src!r} must be a local directory (use download_dir for s3:// sources)")
    return copy_dir(src, dst, client=client, settings=settings, endpoint_url=endpoint_url, region=region)


def download_dir(src: str, dst: str, *, client: Any = None, settings: TransferSettings | None = None, endpoint_url: str | None = None, region: str | None = None) -> TransferReport:
    """Copy ``src`` (``s3://bucket/prefix`` or a local path written by upload_dir) to local directory ``dst``.

    ``src`` may also be a directory inside an uploaded one (``s3://b/rl/global_step_60`` of a mirror of
    ``s3://b/rl``, as :func:`latest_checkpoint` names it): its files are taken from the enclosing manifest.
    """
    if not isinstance(parse_location(dst), LocalLocation):
        raise ValueError(f"download destination {dst!r} must be a local directory (use upload_dir for s3:// destinations)")
    return copy_dir(src, dst, client=client, settings=settings, endpoint_url=endpoint_url, region=region)


def copy_dir(src: str, dst: str, *, client: Any = None, settings: TransferSettings | None = None, endpoint_url: str | None = None, region: str | None = None) -> TransferReport:
    settings = settings or TransferSettings()
    source, destination = parse_location(src), parse_location(dst)
    if isinstance(source, S3Location) and isinstance(destination, S3Location):
        raise ValueError("copying s3:// to s3:// is not supported; download to the PVC first")
    if isinstance(source, S3Location) or isinstance(destination, S3Location):
        client = client or make_client(endpoint_url=endpoint_url, region=region, settings=settings)
    report = TransferReport(source=str(source), destination=str(destination))
    copy = _Copy(client, settings, report, Cancellation())
    with _sigterm_interrupts():
        try:
            manifest = _source_manifest(source, client)
            if isinstance(destination, S3Location):
                _upload(source, destination, manifest, copy)
            else:
                _download(source, destination, manifest, copy)
        except KeyboardInterrupt:
            raise TransferInterruptedError("interrupted (SIGINT)") from None
    log.info(
        "copied %s -> %s: %d file(s) transferred (%d bytes), %d already present",
        source,
        destination,
        len(report.transferred),
        report.bytes_transferred,
        len(report.skipped),
    )
    return report


def _source_manifest(source: Location, client: Any) -> dict[str, FileEntry]:
    if isinstance(source, S3Location):
        return _s3_manifest(source, client)
    if not os.path.isdir(source.path):
        raise FileNotFoundError(f"{source.path} is not a directory")
    if os.path.exists(os.path.join(source.path, COPY_MARKER)):
        raise ValueError(f"{source.path} holds an unfinished copy ({COPY_MARKER}): finish that download before copying it on")
    # A local source is hashed now: its files are the truth, whatever an older manifest says.
    return build_manifest(source.path)


def _s3_manifest(source: S3Location, client: Any) -> dict[str, FileEntry]:
    """The source's own manifest, else its part of the nearest enclosing directory's manifest."""
    from botocore.exceptions import ClientError

    parts = source.prefix.split("/") if source.prefix else []
    for depth in range(len(parts), -1, -1):
        holder = S3Location(source.bucket, "/".join(parts[:depth]))
        try:
            body = client.get_object(Bucket=holder.bucket, Key=holder.key(MANIFEST_NAME))["Body"].read()
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                continue
            raise
        files = entries_under(load_manifest(body, f"{holder}/{MANIFEST_NAME}"), "/".join(parts[depth:]))
        if files:
            return files
        break
    raise ManifestMissingError(f"{source}/{MANIFEST_NAME} does not exist: the upload never completed or was not made by retool storage")


def _phases(manifest: dict[str, FileEntry]) -> list[list[str]]:
    """Files in the order they are copied: verl's tracker files after everything else."""
    trackers = sorted(rel for rel in manifest if rel.rsplit("/", 1)[-1] == TRACKER_FILE)
    return [sorted(set(manifest) - set(trackers)), trackers]


def _run_all(items: list[T], work: Callable[[T], None], settings: TransferSettings, cancellation: Cancellation) -> None:
    """Run ``work`` over items on a pool. The first failure, or an interruption of the caller, cancels
    the rest and waits for the workers to clean up before it is raised."""
    if not items:
        return
    pool = ThreadPoolExecutor(max_workers=settings.file_workers, thread_name_prefix="retool-storage")
    futures = [pool.submit(work, item) for item in items]
    try:
        wait(futures, return_when=FIRST_EXCEPTION)
    except BaseException:
        cancellation.set()
        for future in futures:
            future.cancel()
        pool.shutdown(wait=True)
        raise
    failed = next((f for f in futures if f.done() and not f.cancelled() and f.exception() is not None), None)
    if failed is not None:
        cancellation.set()
        for future in futures:
            future.cancel()
    pool.shutdown(wait=True)
    if failed is not None:
        raise failed.exception()  # type: ignore[misc]


def _with_retries(action: Callable[[], T], what: str, settings: TransferSettings, cancellation: Cancellation) -> T:
    for attempt in range(1, settings.max_attempts + 1):
        cancellation.check()
        try:
            return action()
        except Exception as exc:
            if cancellation.is_set:
                raise TransferInterruptedError(f"{what}: cancelled") from exc
            if attempt == settings.max_attempts or not is_retryable(exc):
                raise
            delay = min(settings.retry_backoff_seconds * 2 ** (attempt - 1), 30.0)
            log.warning("%s failed (attempt %d/%d): %s; retrying in %.1fs", what, attempt, settings.max_attempts, exc, delay)
            time.sleep(delay)
    raise AssertionError("unreachable")


def _s3_transfer(client: Any, settings: TransferSettings, cancellation: Cancellation, start: Callable[[Any], Any]) -> None:
    """Run one s3transfer transfer (``start(manager)`` returns its future), cancellable from another thread."""
    from boto3.s3.transfer import create_transfer_manager

    manager = create_transfer_manager(client, settings.boto3_config())
    try:
        future = start(manager)
        with cancellation.tracking(future):
            future.result()
    finally:
        manager.shutdown()


@dataclass(frozen=True)
class _Copy:
    """What both directions of one copy work with: the S3 client (None between local paths), the
    settings, the report the workers fill and the cancellation they share."""

    client: Any
    settings: TransferSettings
    report: TransferReport
    cancellation: Cancellation

    def run_all(self, items: list[T], work: Callable[[T], None]) -> None:
        _run_all(items, work, self.settings, self.cancellation)

    def retrying(self, action: Callable[[], T], what: str) -> T:
        return _with_retries(action, what, self.settings, self.cancellation)

    def s3(self, start: Callable[[Any], Any]) -> None:
        _s3_transfer(self.client, self.settings, self.cancellation, start)


# ----------------------------------------------------------------------------------------- upload


def _remote_sizes(client: Any, destination: S3Location) -> dict[str, int]:
    sizes = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=destination.bucket, Prefix=destination.list_prefix):
        for obj in page.get("Contents", []):
            sizes[destination.relative(obj["Key"])] = obj["Size"]
    return sizes


def abort_multipart_uploads(client: Any, destination: S3Location) -> int:
    """Abort every unfinished multipart upload under the destination's prefix; returns how many.

    Parts of an upload that was killed stay stored (and billed) until aborted. Two copies never
    write one destination at once (stage attempts are sequential), so every open upload under
    the prefix when a copy starts or fails is one nobody will complete.
    """
    aborted = 0
    for page in client.get_paginator("list_multipart_uploads").paginate(Bucket=destination.bucket, Prefix=destination.list_prefix):
        for upload in page.get("Uploads", []):
            with contextlib.suppress(Exception):  # already completed or aborted meanwhile
                client.abort_multipart_upload(Bucket=destination.bucket, Key=upload["Key"], UploadId=upload["UploadId"])
                aborted += 1
    if aborted:
        log.info("aborted %d unfinished multipart upload(s) under %s", aborted, destination)
    return aborted


def _upload(source: Location, destination: S3Location, manifest: dict[str, FileEntry], copy: _Copy) -> None:
    assert isinstance(source, LocalLocation)
    remote = _remote_sizes(copy.client, destination)
    if MANIFEST_NAME in remote:
        # The destination stops claiming completeness until the new manifest is written.
        copy.client.delete_object(Bucket=destination.bucket, Key=destination.key(MANIFEST_NAME))
    abort_multipart_uploads(copy.client, destination)

    def one(relative: str) -> None:
        entry = manifest[relative]
        key = destination.key(relative)
        if remote.get(relative) == entry.size:
            head = copy.client.head_object(Bucket=destination.bucket, Key=key)
            if head.get("Metadata", {}).get(SHA256_METADATA_KEY) == entry.sha256:
                copy.report.record(relative, entry.size, copied=False)
                return
        path = os.path.join(source.path, relative)
        extra = {"Metadata": {SHA256_METADATA_KEY: entry.sha256}}

        def send() -> None:
            copy.s3(lambda m: m.upload(path, destination.bucket, key, extra_args=extra))

        copy.retrying(send, f"upload of {path} to {destination}")
        copy.report.record(relative, entry.size, copied=True)

    try:
        for phase in _phases(manifest):
            copy.run_all(phase, one)
        copy.cancellation.check()
        copy.client.put_object(Bucket=destination.bucket, Key=destination.key(MANIFEST_NAME), Body=dump_manifest(manifest), ContentType="application/json")
    except BaseException:
        with contextlib.suppress(Exception):  # best effort: s3transfer aborts its own; a rerun sweeps again
            abort_multipart_uploads(copy.client, destination)
        raise


# --------------------------------------------------------------------------------------- download


def _remove_partials(root: str) -> int:
    """Delete temporary files of unfinished downloads under ``root`` (left by a killed copy)."""
    removed = 0
    for directory, _, names in os.walk(root):
        for name in names:
            if is_partial_name(name):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(directory, name))
                    removed += 1
    if removed:
        log.info("removed %d partial file(s) of an interrupted copy under %s", removed, root)
    return removed


def _copy_local_file(src: str, dst: str, cancellation: Cancellation) -> None:
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        while chunk := fin.read(_COPY_CHUNK):
            cancellation.check()
            fout.write(chunk)
    shutil.copymode(src, dst)


def _download(source: Location, destination: LocalLocation, manifest: dict[str, FileEntry], copy: _Copy) -> None:
    os.makedirs(destination.path, exist_ok=True)
    # From here until the manifest is written, the destination is not a complete copy of anything.
    _write_atomic(os.path.join(destination.path, COPY_MARKER), f"copy from {source} in progress (pid {os.getpid()})\n".encode())
    for stale in (MANIFEST_NAME, *_phases(manifest)[1]):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(destination.path, *stale.split("/")))
    _remove_partials(destination.path)

    def fetch(relative: str, temp: str) -> None:
        if isinstance(source, S3Location):
            copy.s3(lambda m: m.download(source.bucket, source.key(relative), temp))
        else:
            _copy_local_file(os.path.join(source.path, relative), temp, copy.cancellation)

    def one(relative: str) -> None:
        entry = manifest[relative]
        target = os.path.join(destination.path, *relative.split("/"))
        if local_matches(target, entry):
            copy.report.record(relative, entry.size, copied=False)
            return
        os.makedirs(os.path.dirname(target), exist_ok=True)
        fd, temp = tempfile.mkstemp(prefix=f".{os.path.basename(target)}{PARTIAL_MARKER}", dir=os.path.dirname(target))
        os.close(fd)
        try:
            copy.retrying(lambda: fetch(relative, temp), f"download of {source}/{relative}")
            size, digest = os.path.getsize(temp), sha256_file(temp)
            if size != entry.size or digest != entry.sha256:
                raise ChecksumMismatchError(
                    f"{source}/{relative}: the manifest promises {entry.size} bytes with sha256 {entry.sha256}, "
                    f"but the copy has {size} bytes with sha256 {digest}; the stored object is corrupt or was overwritten"
                )
            os.replace(temp, target)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)
        copy.report.record(relative, entry.size, copied=True)

    for phase in _phases(manifest):
        copy.run_all(phase, one)
    copy.cancellation.check()
    _write_atomic(os.path.join(destination.path, MANIFEST_NAME), dump_manifest(manifest))
    os.unlink(os.path.join(destination.path, COPY_MARKER))


def _write_atomic(path: str, data: bytes) -> None:
    fd, temp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}{PARTIAL_MARKER}", dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
