"""Where input rows come from: a hub dataset id, a local parquet/jsonl file or directory, or s3://.

Every reader yields ``RowBatch`` objects of bounded size, so a 1.79M-row file never sits in memory
at once. Parquet (local, S3, hub) arrives as Arrow record batches, which lets the RL preparation
deduplicate with vectorised Arrow code; jsonl arrives as Python rows, one per line, where a line
that is not a JSON object is kept as a ``BadLine`` so it is reported as malformed, not lost.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.parquet as pq

logger = logging.getLogger(__name__)

DEFAULT_BATCH_ROWS = 65_536
PARQUET_SUFFIXES = (".parquet",)
JSONL_SUFFIXES = (".jsonl",)
DATA_SUFFIXES = PARQUET_SUFFIXES + JSONL_SUFFIXES
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")

SourceKind = Literal["local", "s3", "hub"]


class SourceError(ValueError):
    """The source cannot be read at all (missing, empty, unreachable, unsupported)."""


@dataclass(frozen=True)
class BadLine:
    """A jsonl line that did not parse into a JSON object."""

    reason: str
    text: str


@dataclass
class RowBatch:
    """Consecutive rows of one input file (``origin``), starting at row ``start`` of that file."""

    origin: str
    start: int
    arrow: pa.RecordBatch | None = None
    rows: list[Any] | None = None

    def __len__(self) -> int:
        return self.arrow.num_rows if self.arrow is not None else len(self.rows or [])

    def to_rows(self) -> list[Any]:
        return self.rows if self.rows is not None else self.arrow.to_pylist()

    def where(self, offset: int) -> str:
        return f"{self.origin}#{self.start + offset}"


@dataclass(frozen=True)
class S3Location:
    bucket: str
    key: str


def classify_source(source: str, *, exists=os.path.exists) -> SourceKind:
    """Decide how to read ``source``: s3:// URI, an existing or path-like local path, else a hub id.

    A relative path that exists wins over a hub id of the same spelling (``data/train`` on disk).
    """
    if not source or not source.strip():
        raise SourceError("empty data source")
    if source.startswith("s3://"):
        return "s3"
    if exists(source) or source.startswith(("/", "./", "../", "~")) or source.endswith(DATA_SUFFIXES):
        return "local"
    if HUB_ID.match(source):
        return "hub"
    raise SourceError(f"data source {source!r} is neither an existing path, an s3:// URI nor a hub id (org/name)")


def parse_s3_uri(uri: str) -> S3Location:
    match = re.match(r"^s3://([^/]+)/?(.*)$", uri)
    if not match or not match.group(1):
        raise SourceError(f"malformed S3 URI {uri!r}: expected s3://bucket/key")
    return S3Location(bucket=match.group(1), key=match.group(2))


def iter_batches(
    source: str,
    *,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    split: str = "train",
    config_name: str | None = None,
    s3_endpoint: str | None = None,
    scratch_dir: str | None = None,
) -> Iterator[RowBatch]:
    """Rows of ``source`` in batches of at most ``batch_rows``.

    ``split``/``config_name`` select a hub dataset's split and configuration. ``s3_endpoint`` points
    boto3 at an S3-compatible store; when unset boto3 uses its own resolution (``AWS_ENDPOINT_URL``,
    profile), and credentials always come from boto3's standard chain. S3 objects are downloaded
    one at a time into ``scratch_dir`` (default: the system temp dir; the prepare functions pass the
    output's directory, on the PVC, since a pod's ephemeral storage may not hold a large parquet).
    """
    kind = classify_source(source)
    if kind == "local":
        yield from _iter_local(Path(source).expanduser(), batch_rows)
    elif kind == "s3":
        yield from _iter_s3(parse_s3_uri(source), batch_rows, s3_endpoint, scratch_dir)
    else:
        yield from _iter_hub(source, batch_rows, split, config_name)


def local_files(path: Path) -> list[Path]:
    """The data files a local path stands for: itself, or every parquet/jsonl file under a directory."""
    if path.is_file():
        if not path.name.endswith(DATA_SUFFIXES):
            raise SourceError(f"{path}: unsupported file type (expected {', '.join(DATA_SUFFIXES)})")
        return [path]
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.name.endswith(DATA_SUFFIXES) and not p.name.startswith("."))
        if not files:
            raise SourceError(f"{path}: directory holds no {' or '.join(DATA_SUFFIXES)} files")
        return files
    raise SourceError(f"{path}: no such file or directory")


def _iter_local(path: Path, batch_rows: int) -> Iterator[RowBatch]:
    for file in local_files(path):
        yield from _iter_file(file, str(file), batch_rows)


def _iter_file(file: Path, origin: str, batch_rows: int) -> Iterator[RowBatch]:
    if file.name.endswith(PARQUET_SUFFIXES):
        yield from _iter_parquet(file, origin, batch_rows)
    else:
        yield from _iter_jsonl(file, origin, batch_rows)


def _iter_parquet(file: Path, origin: str, batch_rows: int) -> Iterator[RowBatch]:
    try:
        parquet = pq.ParquetFile(file)
    except (pa.ArrowException, OSError) as exc:
        raise SourceError(f"{origin}: not a readable parquet file: {exc}") from exc
    start = 0
    for batch in parquet.iter_batches(batch_size=batch_rows):
        yield RowBatch(origin=origin, start=start, arrow=batch)
        start += batch.num_rows


def parse_jsonl_line(line: str) -> dict[str, Any] | BadLine:
    try:
        value = json.loads(line)
    except json.JSONDecodeError as exc:
        return BadLine(reason=f"invalid JSON: {exc.msg}", text=line[:200])
    if not isinstance(value, dict):
        return BadLine(reason=f"JSON line is a {type(value).__name__}, not an object", text=line[:200])
    return value


def _iter_jsonl(file: Path, origin: str, batch_rows: int) -> Iterator[RowBatch]:
    """Line numbers (1-based) are the row positions, so reports point at the offending line."""
    rows: list[Any] = []
    start = 1
    with open(file, encoding="utf-8", errors="replace") as handle:
        for number, line in enumerate(handle, start=1):
            if not rows:
                start = number
            if not line.strip():
                rows.append(BadLine(reason="blank line", text=""))
            else:
                rows.append(parse_jsonl_line(line))
            if len(rows) >= batch_rows:
                yield RowBatch(origin=origin, start=start, rows=rows)
                rows = []
    if rows:
        yield RowBatch(origin=origin, start=start, rows=rows)


def s3_client(endpoint: str | None = None):
    """A boto3 S3 client: standard credential chain; explicit endpoint, else boto3's own (AWS_ENDPOINT_URL)."""
    import boto3

    return boto3.client("s3", endpoint_url=endpoint or None)


def s3_objects(client, location: S3Location) -> list[str]:
    """Keys a URI stands for: the object itself, or every parquet/jsonl object under it as a prefix."""
    from botocore.exceptions import ClientError

    if location.key and not location.key.endswith("/"):
        try:
            client.head_object(Bucket=location.bucket, Key=location.key)
            if not location.key.endswith(DATA_SUFFIXES):
                raise SourceError(f"s3://{location.bucket}/{location.key}: unsupported object type (expected {', '.join(DATA_SUFFIXES)})")
            return [location.key]
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") not in ("404", "NoSuchKey", "NotFound"):
                raise SourceError(f"s3://{location.bucket}/{location.key}: {exc}") from exc
    prefix = location.key if not location.key or location.key.endswith("/") else location.key + "/"
    keys: list[str] = []
    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=location.bucket, Prefix=prefix):
            keys += [item["Key"] for item in page.get("Contents", []) if item["Key"].endswith(DATA_SUFFIXES)]
    except ClientError as exc:
        raise SourceError(f"s3://{location.bucket}/{prefix}: {exc}") from exc
    if not keys:
        raise SourceError(f"s3://{location.bucket}/{location.key}: no such object, and no {' or '.join(DATA_SUFFIXES)} objects under it")
    return sorted(keys)


def _iter_s3(location: S3Location, batch_rows: int, endpoint: str | None, scratch_dir: str | None = None) -> Iterator[RowBatch]:
    """Download each object to a temporary file (parquet needs random access), read it, delete it."""
    from botocore.exceptions import BotoCoreError, ClientError

    client = s3_client(endpoint)
    try:
        keys = s3_objects(client, location)
    except BotoCoreError as exc:
        raise SourceError(f"s3://{location.bucket}/{location.key}: {exc}") from exc
    with tempfile.TemporaryDirectory(prefix=".retool-s3-", dir=scratch_dir) as scratch:
        for number, key in enumerate(keys):
            local = Path(scratch) / f"{number}-{Path(key).name}"
            logger.info("downloading s3://%s/%s", location.bucket, key)
            try:
                client.download_file(location.bucket, key, str(local))
            except (BotoCoreError, ClientError) as exc:
                raise SourceError(f"s3://{location.bucket}/{key}: download failed: {exc}") from exc
            yield from _iter_file(local, f"s3://{location.bucket}/{key}", batch_rows)
            local.unlink()


def load_hub_dataset(dataset_id: str, split: str, config_name: str | None):
    """``datasets.load_dataset`` in streaming mode: rows arrive as they download, never all in memory."""
    import datasets

    return datasets.load_dataset(dataset_id, config_name, split=split, streaming=True)


def _iter_hub(dataset_id: str, batch_rows: int, split: str, config_name: str | None) -> Iterator[RowBatch]:
    try:
        dataset = load_hub_dataset(dataset_id, split, config_name)
    except Exception as exc:  # datasets raises many unrelated types (FileNotFoundError, HfHubHTTPError, ValueError ...)
        raise SourceError(f"hub dataset {dataset_id!r} (split {split!r}): {exc}") from exc
    origin = f"{dataset_id}[{split}]"
    start = 0
    for table in dataset.with_format("arrow").iter(batch_size=batch_rows):
        for batch in table.to_batches():
            yield RowBatch(origin=origin, start=start, arrow=batch)
            start += batch.num_rows
