"""Copy a directory between a PVC path and S3 (or PVC to PVC), verified and resumable.

- Upload: every file is hashed, objects carry their sha256 as metadata, files whose object
  already holds the same bytes are skipped (an interrupted upload resumes), and the manifest is
  written last, so a destination with a manifest is complete.
- Download: the source manifest is required; each file lands in a temporary name beside its
  target, is verified against the manifest, and only then renamed into place, so the local
  side never holds a half-written or unverified file under its real name. Files already
  matching the manifest are skipped (a restarted download resumes).
- Transfers are multipart above ``TransferSettings.multipart_threshold`` and retried: botocore
  retries each API call, and a file whose transfer still fails is retried as a whole.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, TypeVar

from retool.storage.location import LocalLocation, Location, S3Location, parse_location
from retool.storage.manifest import (
    MANIFEST_NAME,
    PARTIAL_MARKER,
    SHA256_METADATA_KEY,
    ChecksumMismatchError,
    FileEntry,
    ManifestMissingError,
    build_manifest,
    dump_manifest,
    load_manifest,
    local_matches,
    sha256_file,
)
from retool.storage.s3 import TransferSettings, is_retryable, make_client

log = logging.getLogger(__name__)
T = TypeVar("T")


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


def upload_dir(src: str, dst: str, *, client: Any = None, settings: TransferSettings | None = None, endpoint_url: str | None = None, region: str | None = None) -> TransferReport:
    """Copy local directory ``src`` to ``dst`` (``s3://bucket/prefix`` or another local path)."""
    if not isinstance(parse_location(src), LocalLocation):
        raise ValueError(f"upload source {src!r} must be a local directory (use download_dir for s3:// sources)")
    return copy_dir(src, dst, client=client, settings=settings, endpoint_url=endpoint_url, region=region)


def download_dir(src: str, dst: str, *, client: Any = None, settings: TransferSettings | None = None, endpoint_url: str | None = None, region: str | None = None) -> TransferReport:
    """Copy ``src`` (``s3://bucket/prefix`` or a local path written by upload_dir) to local directory ``dst``."""
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
    manifest = _source_manifest(source, client)
    if isinstance(destination, S3Location):
        _upload(source, destination, manifest, client, settings, report)
    else:
        _download(source, destination, manifest, client, settings, report)
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
        from botocore.exceptions import ClientError

        try:
            body = client.get_object(Bucket=source.bucket, Key=source.key(MANIFEST_NAME))["Body"].read()
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                raise ManifestMissingError(f"{source}/{MANIFEST_NAME} does not exist: the upload never completed or was not made by retool storage") from None
            raise
        return load_manifest(body, f"{source}/{MANIFEST_NAME}")
    if not os.path.isdir(source.path):
        raise FileNotFoundError(f"{source.path} is not a directory")
    # A local source is hashed now: its files are the truth, whatever an older manifest says.
    return build_manifest(source.path)


def _run_all(items: list[T], work: Callable[[T], None], settings: TransferSettings) -> None:
    """Run ``work`` over items on a pool; the first failure stops new work and is raised."""
    with ThreadPoolExecutor(max_workers=settings.file_workers, thread_name_prefix="retool-storage") as pool:
        futures = [pool.submit(work, item) for item in items]
        _, pending = wait(futures, return_when=FIRST_EXCEPTION)
        for future in pending:
            future.cancel()
        wait(pending)
        for future in futures:
            if future.done() and not future.cancelled() and future.exception() is not None:
                raise future.exception()  # type: ignore[misc]


def _with_retries(action: Callable[[], T], what: str, settings: TransferSettings) -> T:
    for attempt in range(1, settings.max_attempts + 1):
        try:
            return action()
        except Exception as exc:
            if attempt == settings.max_attempts or not is_retryable(exc):
                raise
            delay = min(settings.retry_backoff_seconds * 2 ** (attempt - 1), 30.0)
            log.warning("%s failed (attempt %d/%d): %s; retrying in %.1fs", what, attempt, settings.max_attempts, exc, delay)
            time.sleep(delay)
    raise AssertionError("unreachable")


# ----------------------------------------------------------------------------------------- upload


def _remote_sizes(client: Any, destination: S3Location) -> dict[str, int]:
    sizes = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=destination.bucket, Prefix=destination.list_prefix):
        for obj in page.get("Contents", []):
            sizes[destination.relative(obj["Key"])] = obj["Size"]
    return sizes


def _upload(source: Location, destination: S3Location, manifest: dict[str, FileEntry], client: Any, settings: TransferSettings, report: TransferReport) -> None:
    assert isinstance(source, LocalLocation)
    remote = _remote_sizes(client, destination)
    if MANIFEST_NAME in remote:
        # The destination stops claiming completeness until the new manifest is written.
        client.delete_object(Bucket=destination.bucket, Key=destination.key(MANIFEST_NAME))
    transfer_config = settings.boto3_config()

    def one(relative: str) -> None:
        entry = manifest[relative]
        key = destination.key(relative)
        if remote.get(relative) == entry.size:
            head = client.head_object(Bucket=destination.bucket, Key=key)
            if head.get("Metadata", {}).get(SHA256_METADATA_KEY) == entry.sha256:
                report.record(relative, entry.size, copied=False)
                return
        path = os.path.join(source.path, relative)
        extra = {"Metadata": {SHA256_METADATA_KEY: entry.sha256}}
        _with_retries(lambda: client.upload_file(path, destination.bucket, key, ExtraArgs=extra, Config=transfer_config), f"upload of {path} to {destination}", settings)
        report.record(relative, entry.size, copied=True)

    _run_all(sorted(manifest), one, settings)
    client.put_object(Bucket=destination.bucket, Key=destination.key(MANIFEST_NAME), Body=dump_manifest(manifest), ContentType="application/json")


# --------------------------------------------------------------------------------------- download


def _download(source: Location, destination: LocalLocation, manifest: dict[str, FileEntry], client: Any, settings: TransferSettings, report: TransferReport) -> None:
    os.makedirs(destination.path, exist_ok=True)
    transfer_config = settings.boto3_config() if isinstance(source, S3Location) else None

    def fetch(relative: str, temp: str) -> None:
        if isinstance(source, S3Location):
            client.download_file(source.bucket, source.key(relative), temp, Config=transfer_config)
        else:
            shutil.copyfile(os.path.join(source.path, relative), temp)

    def one(relative: str) -> None:
        entry = manifest[relative]
        target = os.path.join(destination.path, *relative.split("/"))
        if local_matches(target, entry):
            report.record(relative, entry.size, copied=False)
            return
        os.makedirs(os.path.dirname(target), exist_ok=True)
        fd, temp = tempfile.mkstemp(prefix=f".{os.path.basename(target)}{PARTIAL_MARKER}", dir=os.path.dirname(target))
        os.close(fd)
        try:
            _with_retries(lambda: fetch(relative, temp), f"download of {source}/{relative}", settings)
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
        report.record(relative, entry.size, copied=True)

    _run_all(sorted(manifest), one, settings)
    _write_atomic(os.path.join(destination.path, MANIFEST_NAME), dump_manifest(manifest))


def _write_atomic(path: str, data: bytes) -> None:
    fd, temp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}{PARTIAL_MARKER}", dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(temp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
