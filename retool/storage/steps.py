"""Find the latest complete verl checkpoint of a stage on the PVC (the rule ``retool.stage`` resumes by).

verl writes ``<default_local_dir>/global_step_N/`` and then, atomically, the tracker file
``latest_checkpointed_iteration.txt`` holding N. The tracker is the authority (a directory without
it may be half-written); directories are only a fallback for a tracker lost or pointing nowhere,
and then only directories that hold files count.

A directory can also arrive by copy (``retool storage download``, a PVC-to-PVC mirror). Such a
copy counts only when it finished: while it runs, and forever if it was killed, the directory holds
the copy marker, and nothing in it is a checkpoint until a rerun completes it. A finished copy
holds a manifest, and a step it lists counts only when every file the manifest lists for that
step is in place with its size (each was verified against its sha256 before it was renamed there).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path

from retool.storage.manifest import COPY_MARKER, MANIFEST_NAME, FileEntry, entries_under, is_partial_name, local_manifest

log = logging.getLogger(__name__)

TRACKER_FILE = "latest_checkpointed_iteration.txt"
_STEP_DIR = re.compile(r"^global_step_(\d+)$")


class NoCheckpointError(FileNotFoundError):
    """The stage that should have produced a checkpoint did not (or its copy is incomplete)."""


def step_of(name: str) -> int | None:
    """N for a ``global_step_N`` directory name, else None."""
    match = _STEP_DIR.match(name)
    return int(match.group(1)) if match else None


def choose_step(tracker: str | None, complete: Mapping[int, bool], where: str = "") -> int | None:
    """The step to resume from: the tracker's when that step is complete, else the newest complete one.

    One decision for the PVC (``latest_step``) and for S3 mirrors (``latest_checkpoint``).

    >>> choose_step("60", {30: True, 60: True, 90: False})
    60
    >>> choose_step("90", {30: True, 60: True, 90: False})
    60
    """
    text = (tracker or "").strip()
    if text:
        if text.isdigit() and complete.get(int(text), False):
            return int(text)
        log.warning("%s%s holds %r, which names no complete checkpoint; falling back to the newest complete global_step_N", where and where + "/", TRACKER_FILE, text)
    for step in sorted(complete, reverse=True):
        if complete[step]:
            return step
    return None


def manifest_step_complete(files: Mapping[str, FileEntry], step: int, required_subdir: str, size_of) -> bool | None:
    """Whether the manifest's files of ``global_step_N[/required_subdir]`` are all present (``size_of(rel)``
    is the present size or None); None when the manifest lists nothing of that step (written after the copy)."""
    listed = entries_under(dict(files), f"global_step_{step}")
    if not listed:
        return None
    wanted = entries_under(listed, required_subdir) if required_subdir else listed
    if not wanted:
        return False
    prefix = f"global_step_{step}/" + (required_subdir.strip("/") + "/" if required_subdir else "")
    return all(size_of(prefix + rel) == entry.size for rel, entry in wanted.items())


def _has_files(directory: Path) -> bool:
    """A directory with at least one regular file that is not a partial download, at any depth."""
    return any(not is_partial_name(name) and name not in (MANIFEST_NAME, COPY_MARKER) for _, _, names in os.walk(directory) for name in names)


def _local_size(root: Path, relative: str) -> int | None:
    try:
        stat = (root / relative).stat()
    except OSError:
        return None
    return stat.st_size if (root / relative).is_file() else None


def latest_step(checkpoints_dir: str | Path, required_subdir: str = "") -> int:
    """The step of the latest complete checkpoint under ``checkpoints_dir``.

    ``required_subdir`` (``actor`` for RL) must exist inside ``global_step_N`` for it to count.
    """
    root = Path(checkpoints_dir)
    if not root.is_dir():
        raise NoCheckpointError(f"{root} does not exist: the stage that writes these checkpoints has not saved any")
    if (root / COPY_MARKER).exists():
        raise NoCheckpointError(
            f"{root} holds an unfinished copy ({COPY_MARKER}): a download into it was interrupted, so none of its checkpoints "
            "can be trusted; rerun the download (`retool storage download SRC DST` resumes and verifies) before resuming from it"
        )
    try:
        manifest = local_manifest(str(root))
    except ValueError as exc:
        raise NoCheckpointError(f"{root}: {exc}; rerun the copy that wrote it") from exc

    def complete(step: int) -> bool:
        if manifest is not None:
            listed = manifest_step_complete(manifest, step, required_subdir, lambda rel: _local_size(root, rel))
            if listed is not None:
                return listed
        directory = root / f"global_step_{step}" / required_subdir
        return directory.is_dir() and _has_files(directory)

    tracker_path = root / TRACKER_FILE
    tracker = tracker_path.read_text(encoding="utf-8", errors="replace") if tracker_path.is_file() else None
    steps = [s for p in root.iterdir() if (s := step_of(p.name)) is not None and p.is_dir()]
    if manifest is not None:
        steps += [s for rel in manifest if (s := step_of(rel.split("/", 1)[0])) is not None]
    chosen = choose_step(tracker, {step: complete(step) for step in set(steps)}, str(root))
    if chosen is None:
        where = f"global_step_N/{required_subdir}" if required_subdir else "global_step_N"
        raise NoCheckpointError(f"no complete checkpoint ({where} with files) under {root}")
    return chosen
