"""Find the latest verl checkpoint of a stage on the PVC.

verl writes ``<default_local_dir>/global_step_N/`` and then, atomically, the tracker file
``latest_checkpointed_iteration.txt`` holding N. The tracker is the authority (a directory without
it may be half-written); directories are only a fallback for a tracker lost or pointing nowhere,
and then only directories that hold files count.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

log = logging.getLogger(__name__)

TRACKER_FILE = "latest_checkpointed_iteration.txt"
_STEP_DIR = re.compile(r"^global_step_(\d+)$")


class NoCheckpointError(FileNotFoundError):
    """The stage that should have produced a checkpoint did not."""


def latest_step(checkpoints_dir: str | Path, required_subdir: str = "") -> int:
    """The step of the latest complete checkpoint under ``checkpoints_dir``.

    ``required_subdir`` (``actor`` for RL) must exist inside ``global_step_N`` for it to count.
    """
    root = Path(checkpoints_dir)
    if not root.is_dir():
        raise NoCheckpointError(f"{root} does not exist: the stage that writes these checkpoints has not saved any")

    def complete(step: int) -> bool:
        directory = root / f"global_step_{step}" / required_subdir
        return directory.is_dir() and any(directory.iterdir())

    tracker = root / TRACKER_FILE
    if tracker.is_file():
        text = tracker.read_text(encoding="utf-8").strip()
        if text.isdigit() and complete(int(text)):
            return int(text)
        log.warning("%s holds %r, which names no complete checkpoint; falling back to the newest global_step_N", tracker, text)
    steps = sorted((int(m.group(1)) for p in root.iterdir() if (m := _STEP_DIR.match(p.name)) and p.is_dir()), reverse=True)
    for step in steps:
        if complete(step):
            return step
    where = f"global_step_N/{required_subdir}" if required_subdir else "global_step_N"
    raise NoCheckpointError(f"no complete checkpoint ({where} with files) under {root}")
