"""File checks against what the source reports: sizes, sha256, git blob ids, S3 MD5 ETags."""

from __future__ import annotations

import hashlib
import os

_CHUNK = 8 * 1024 * 1024


def digests(path: str, *, git_blob: bool = False, md5: bool = False) -> dict[str, str]:
    """sha256 of the file, and on request its git blob id (sha1 of ``blob <size>\\0<bytes>``) and MD5, in one read."""
    size = os.path.getsize(path)
    hashes = {"sha256": hashlib.sha256()}
    if git_blob:
        hashes["git_sha1"] = hashlib.sha1(f"blob {size}\0".encode())
    if md5:
        hashes["md5"] = hashlib.md5()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            for h in hashes.values():
                h.update(chunk)
    return {name: h.hexdigest() for name, h in hashes.items()}


def single_part_md5(etag: str | None) -> str | None:
    """The MD5 an S3 ETag stands for, or None when it is not one (multipart ``...-N`` or SSE-KMS opaque ids)."""
    if not etag:
        return None
    value = etag.strip('"').lower()
    return value if len(value) == 32 and all(c in "0123456789abcdef" for c in value) else None
