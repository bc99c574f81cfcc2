"""Where a directory lives: an ``s3://bucket/prefix`` URI or a local (PVC) path.

Stages hand checkpoints to each other through the PVC and mirror them to S3; every copy
helper takes either kind, so the decision "which side is remote" is made once, here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


@dataclass(frozen=True)
class S3Location:
    bucket: str
    prefix: str
    """Key prefix without leading or trailing slash ('' is the bucket root)."""

    def key(self, relative: str) -> str:
        return f"{self.prefix}/{relative}" if self.prefix else relative

    def relative(self, key: str) -> str:
        return key[len(self.prefix) + 1 :] if self.prefix else key

    @property
    def list_prefix(self) -> str:
        """Prefix for listing the directory's objects (never matches a sibling like prefix-2)."""
        return f"{self.prefix}/" if self.prefix else ""

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"


@dataclass(frozen=True)
class LocalLocation:
    path: str

    def __str__(self) -> str:
        return self.path


Location = S3Location | LocalLocation


def parse_location(value: str) -> Location:
    """``s3://bucket/some/prefix`` -> S3Location; anything else is a local path.

    >>> parse_location("s3://ckpt/runs/a/")
    S3Location(bucket='ckpt', prefix='runs/a')
    """
    if not value:
        raise ValueError("empty location: give an s3://bucket/prefix URI or a directory path")
    if value.startswith("s3://"):
        bucket, _, prefix = value[len("s3://") :].partition("/")
        if not _BUCKET.match(bucket):
            raise ValueError(f"{value!r}: {bucket!r} is not a valid S3 bucket name")
        prefix = prefix.strip("/")
        if any(part in ("", ".", "..") for part in prefix.split("/")) and prefix:
            raise ValueError(f"{value!r}: the key prefix must not contain empty, '.' or '..' segments")
        return S3Location(bucket=bucket, prefix=prefix)
    if "://" in value:
        raise ValueError(f"{value!r}: only s3:// URIs and local paths are supported")
    return LocalLocation(path=value)
