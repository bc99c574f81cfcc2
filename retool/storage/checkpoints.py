"""Find verl's latest checkpoint in a checkpoint directory (PVC path or s3:// mirror).

verl writes ``global_step_N/`` directories and a tracker file ``latest_checkpointed_iteration.txt``
holding N once step N is fully saved. The tracker is authoritative (a directory without it may
be half-written); without a tracker, the highest complete-looking step is a fallback.
"""

from __future__ import annotations

import os
from typing import Any

from retool.recipe.checkpoints import _STEP_DIR as STEP_DIR
from retool.recipe.checkpoints import TRACKER_FILE, NoCheckpointError, latest_step
from retool.storage.location import LocalLocation, S3Location, parse_location


def pick_latest(tracker: str | None, step_dirs: list[str]) -> int | None:
    """The step to resume from, given the tracker's text and the step directory names present."""
    steps = sorted(int(m.group(1)) for name in step_dirs if (m := STEP_DIR.match(name)))
    if tracker is not None and tracker.strip():
        try:
            tracked = int(tracker.strip())
        except ValueError:
            raise ValueError(f"{TRACKER_FILE} holds {tracker.strip()!r}, not a step number") from None
        return tracked if tracked in steps else None
    return steps[-1] if steps else None


def latest_checkpoint(directory: str, *, client: Any = None) -> str | None:
    """Path or URI of the latest ``global_step_N`` under ``directory``; None when there is none."""
    location = parse_location(directory)
    if isinstance(location, LocalLocation):
        # The stage entrypoint's rule (tracker first, complete directories as fallback), one definition.
        try:
            return os.path.join(location.path, f"global_step_{latest_step(location.path)}")
        except NoCheckpointError:
            return None
    return _latest_s3(location, client)


def _latest_s3(location: S3Location, client: Any) -> str | None:
    from retool.storage.s3 import make_client

    client = client or make_client()
    names: list[str] = []
    tracker = None
    paginator = client.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=location.bucket, Prefix=location.list_prefix, Delimiter="/"):
        names.extend(p["Prefix"][len(location.list_prefix) :].rstrip("/") for p in page.get("CommonPrefixes", []))
        if any(o["Key"] == location.key(TRACKER_FILE) for o in page.get("Contents", [])):
            tracker = client.get_object(Bucket=location.bucket, Key=location.key(TRACKER_FILE))["Body"].read().decode()
    step = pick_latest(tracker, names)
    return None if step is None else f"{location}/global_step_{step}"
