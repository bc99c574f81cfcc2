"""The sha256 manifest written beside a copied directory, and the marker of a copy in progress.

S3's ETag is not a content hash for multipart uploads, so integrity is checked with our own
sha256 per file. The manifest is written LAST and removed FIRST when a copy is replaced: its
presence means the copy is complete, and a download verifies every file against it. Each object
also carries its sha256 as metadata, so an interrupted upload resumes by skipping objects that
already hold the right bytes.

A local destination also carries :data:`COPY_MARKER` from the first byte written until the
manifest is in place: a PVC directory verl wrote has neither file, so the marker is what tells
"a download killed half-way" apart from "a checkpoint directory verl saved" (both lack a manifest).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass

MANIFEST_NAME = ".retool-manifest.json"
COPY_MARKER = ".retool-copy-incomplete"
"""Present in a local directory while a copy into it is unfinished (or was killed)."""
MANIFEST_VERSION = 1
SHA256_METADATA_KEY = "sha256"
"""User metadata key on each object (x-amz-meta-sha256)."""

_CHUNK = 8 * 1024 * 1024


class ChecksumMismatchError(RuntimeError):
    """A copied file does not hold the bytes its manifest promises (corruption or a concurrent writer)."""


class ManifestMissingError(FileNotFoundError):
    """The source has no manifest: its upload never completed, or it was not written by retool."""


@dataclass(frozen=True)
class FileEntry:
    size: int
    sha256: str


def sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def walk_files(root: str) -> Iterator[str]:
    """Relative POSIX paths of the regular files under ``root`` (sorted, manifest and temp files excluded)."""
    found = []
    for directory, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in filenames:
            if name in (MANIFEST_NAME, COPY_MARKER) or is_partial_name(name):
                continue
            full = os.path.join(directory, name)
            if os.path.isfile(full):
                found.append(os.path.relpath(full, root).replace(os.sep, "/"))
    yield from sorted(found)


PARTIAL_MARKER = ".retool-partial-"


def is_partial_name(name: str) -> bool:
    """Temporary files of an unfinished download; never copied, never counted."""
    return PARTIAL_MARKER in name


def build_manifest(root: str) -> dict[str, FileEntry]:
    return {rel: FileEntry(size=os.path.getsize(os.path.join(root, rel)), sha256=sha256_file(os.path.join(root, rel))) for rel in walk_files(root)}


def dump_manifest(files: dict[str, FileEntry]) -> bytes:
    payload = {"version": MANIFEST_VERSION, "files": {rel: {"size": e.size, "sha256": e.sha256} for rel, e in sorted(files.items())}}
    return json.dumps(payload, indent=1, sort_keys=True).encode()


def load_manifest(data: bytes, where: str) -> dict[str, FileEntry]:
    try:
        payload = json.loads(data)
        if payload.get("version") != MANIFEST_VERSION:
            raise ValueError(f"unsupported manifest version {payload.get('version')!r}")
        files = {rel: FileEntry(size=int(e["size"]), sha256=str(e["sha256"])) for rel, e in payload["files"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{where}: unreadable manifest ({exc})") from exc
    for rel in files:
        if rel.startswith("/") or ".." in rel.split("/"):
            raise ValueError(f"{where}: manifest entry {rel!r} escapes the directory")
    return files


def entries_under(files: dict[str, FileEntry], prefix: str) -> dict[str, FileEntry]:
    """The entries below directory ``prefix`` (relative POSIX path, no slashes at the ends), re-rooted there."""
    if not prefix:
        return dict(files)
    head = prefix.strip("/") + "/"
    return {rel[len(head) :]: entry for rel, entry in files.items() if rel.startswith(head)}


def local_manifest(root: str) -> dict[str, FileEntry] | None:
    """The manifest of local directory ``root``: None when it has none; ValueError when it is unreadable."""
    path = os.path.join(root, MANIFEST_NAME)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    return load_manifest(data, path)


def local_matches(path: str, entry: FileEntry) -> bool:
    """True when ``path`` already holds exactly the entry's bytes (size first: cheap)."""
    return os.path.isfile(path) and os.path.getsize(path) == entry.size and sha256_file(path) == entry.sha256
