"""Where input rows come from: a hub dataset id, a local parquet/jsonl file or directory, or s3://.

Every reader yields ``RowBatch`` objects of bounded size, so a 1.79M-row file never sits in memory
at once. Parquet (local, S3, hub) arrives as Arrow record batches, which lets the RL preparation
deduplicate with vectorised Arrow code; jsonl arrives as Python rows, one per line, where a line
that is not a JSON object is kept as a ``BadLine`` so it is reported as malformed, not lost.

Text is decoded strictly: bytes that are not UTF-8 make their row a ``BadLine`` ("not valid
UTF-8"), never a prompt or a ground truth with U+FFFD in it. A file that stops being readable in
the middle (a truncated download, a corrupt parquet page, an I/O error) raises ``SourceError``
naming the file and where it broke, instead of a traceback or a silently shorter data set.
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
    """The source cannot be read (missing, empty, unreachable, unsupported, or broken part-way)."""


@dataclass(frozen=True)
class BadLine:
    """A row that could not even be read as one: a jsonl line that is not a JSON object, or text that is not UTF-8."""

    reason: str
    text: str


NOT_UTF8 = "not valid UTF-8"


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
        """Python rows; in an Arrow batch, a row holding bytes that are not UTF-8 becomes a ``BadLine``."""
        if self.rows is not None:
            return self.rows
        try:
            return self.arrow.to_pylist()
        except UnicodeDecodeError:
            return [self._row(i) for i in range(self.arrow.num_rows)]

    def _row(self, index: int) -> Any:
        try:
            return self.arrow.slice(index, 1).to_pylist()[0]
        except UnicodeDecodeError as exc:
            return BadLine(reason=NOT_UTF8, text=f"{exc.reason} (byte 0x{exc.object[exc.start]:02x} at offset {exc.start} of a text value)")

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
    """Row group by row group, so that a corrupt page is reported with the row group and rows it breaks."""
    try:
        parquet = pq.ParquetFile(file)
    except (pa.ArrowException, OSError) as exc:
        raise SourceError(f"{origin}: not a readable parquet file: {exc}") from exc
    groups = parquet.metadata.num_row_groups
    start = 0
    for group in range(groups):
        group_start = start
        batches = parquet.iter_batches(batch_size=batch_rows, row_groups=[group])
        while True:
            try:
                batch = next(batches)
            except StopIteration:
                break
            except (pa.ArrowException, OSError) as exc:  # a corrupt page or a truncated file: never a silently shorter data set
                rows = parquet.metadata.row_group(group).num_rows
                raise SourceError(
                    f"{origin}: unreadable from row {start} (row group {group + 1} of {groups}, rows {group_start}-{group_start + rows - 1}): {exc}"
                ) from exc
            yield RowBatch(origin=origin, start=start, arrow=batch)
            start += batch.num_rows


def parse_jsonl_line(line: str) -> dict[str, Any] | BadLine:
    try:
        value = json.loads(line)
    except json.JSONDecodeError as exc:
        return BadLine(reason=f"invalid JSON: {exc.msg}", text=line[:200])
    if not isinstance(value, dict):
        return BadLine(reason=f"JSON line is a {type(value).__name__}, not an object", text=line[:200])
    if "\\ud" in line.lower() and not _encodable(value):
        return BadLine(reason=NOT_UTF8, text=f"an escaped lone surrogate: {line[:160]}")
    return value


def _encodable(value: Any) -> bool:
    """False when a string inside ``value`` holds a lone surrogate (valid JSON escape, not encodable text)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True
    if isinstance(value, dict):
        return all(_encodable(k) and _encodable(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_encodable(v) for v in value)
    return True


def parse_jsonl_bytes(raw: bytes, first: bool = False) -> dict[str, Any] | BadLine:
    """One line as read from disk: strict UTF-8 (a BOM on the first line is allowed), then JSON."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        shown = raw[:160].decode("utf-8", "backslashreplace").rstrip("\r\n")
        return BadLine(reason=NOT_UTF8, text=f"byte 0x{raw[exc.start]:02x} at column {exc.start + 1}: {shown}")
    if first:
        line = line.removeprefix("\ufeff")
    if not line.strip():
        return BadLine(reason="blank line", text="")
    return parse_jsonl_line(line)


def _iter_jsonl(file: Path, origin: str, batch_rows: int) -> Iterator[RowBatch]:
    """Line numbers (1-based) are the row positions, so reports point at the offending line."""
    rows: list[Any] = []
    start = number = 1
    try:
        handle = open(file, "rb")  # noqa: SIM115 - closed below; reads must be wrapped, yields must not
    except OSError as exc:
        raise SourceError(f"{origin}: cannot be opened: {exc}") from exc
    with handle:
        lines = iter(handle)
        while True:
            try:
                raw = next(lines)
            except StopIteration:
                break
            except OSError as exc:
                raise SourceError(f"{origin}: unreadable after line {number - 1}: {exc}") from exc
            if not rows:
                start = number
            rows.append(parse_jsonl_bytes(raw, first=number == 1))
            number += 1
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
    tables = iter(dataset.with_format("arrow").iter(batch_size=batch_rows))
    while True:
        try:
            table = next(tables)
        except StopIteration:
            return
        except Exception as exc:  # a download or a shard that breaks part-way
            raise SourceError(f"{origin}: reading failed after row {start}: {exc}") from exc
        for batch in table.to_batches():
            yield RowBatch(origin=origin, start=start, arrow=batch)
            start += batch.num_rows
