"""The staged-model manifest: written last, so its presence means the copy is complete and verified."""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

STAGED_MANIFEST = ".retool-staged.json"
MANIFEST_VERSION = 1


@dataclass(frozen=True)
class StagedFile:
    size: int
    sha256: str | None = None
    """LFS files on the hub, S3 objects with sha256 metadata, or computed."""
    git_sha1: str | None = None
    """The git blob id of a small (non-LFS) hub file."""


@dataclass(frozen=True)
class StagedModel:
    kind: str
    source: str
    revision: str | None
    """What the spec asked for (hub branch, tag or commit)."""
    commit: str | None
    """What was staged: the hub commit the revision resolved to (None for S3)."""
    files: dict[str, StagedFile] = field(default_factory=dict)

    def same_source(self, kind: str, source: str, revision: str | None) -> bool:
        return (self.kind, self.source, self.revision) == (kind, source, revision)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files.values())


def read_staged(directory: str) -> StagedModel | None:
    """The manifest of ``directory``, or None when the directory holds no complete staged model."""
    path = os.path.join(directory, STAGED_MANIFEST)
    try:
        with open(path, encoding="utf-8") as f:
            data: dict[str, Any] = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        raise ValueError(f"{path} is unreadable ({err}); remove it to stage the model again") from err
    if data.get("version") != MANIFEST_VERSION:
        return None
    files = {name: StagedFile(**entry) for name, entry in data["files"].items()}
    return StagedModel(kind=data["kind"], source=data["source"], revision=data.get("revision"), commit=data.get("commit"), files=files)


def write_staged(directory: str, staged: StagedModel) -> None:
    """Write the manifest atomically (temp file, fsync, rename): the last step of staging."""
    path = os.path.join(directory, STAGED_MANIFEST)
    data = {"version": MANIFEST_VERSION, **asdict(staged)}
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def remove_staged(directory: str) -> None:
    """Drop the manifest first when a staged copy is about to be replaced (it must never describe a half copy)."""
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(directory, STAGED_MANIFEST))
