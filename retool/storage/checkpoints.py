"""Find verl's latest checkpoint in a checkpoint directory (PVC path or s3:// mirror).

verl writes ``global_step_N/`` directories and a tracker file ``latest_checkpointed_iteration.txt``
holding N once step N is fully saved. The PVC rule is the stage's (:func:`retool.storage.steps.latest_step`).

An s3:// mirror is only ever written by ``upload_dir``, which removes the manifest first and writes
it last, so a mirror without a manifest is an upload in progress or one that was killed: nothing
in it counts. In a mirror with a manifest, step N counts when every file the manifest lists for
``global_step_N`` is stored with its listed size; the tracker then picks among those steps.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from retool.storage.location import LocalLocation, S3Location, parse_location
from retool.storage.manifest import MANIFEST_NAME, load_manifest
from retool.storage.steps import TRACKER_FILE, NoCheckpointError, choose_step, latest_step, manifest_step_complete, step_of

log = logging.getLogger(__name__)


def latest_checkpoint(directory: str, *, client: Any = None, required_subdir: str = "") -> str | None:
    """Path or URI of the latest complete ``global_step_N`` under ``directory``; None when there is none."""
    location = parse_location(directory)
    if isinstance(location, LocalLocation):
        try:
            return os.path.join(location.path, f"global_step_{latest_step(location.path, required_subdir)}")
        except NoCheckpointError as exc:
            log.info("%s", exc)
            return None
    return _latest_s3(location, client, required_subdir)


def _latest_s3(location: S3Location, client: Any, required_subdir: str) -> str | None:
    from botocore.exceptions import ClientError

    from retool.storage.s3 import make_client

    client = client or make_client()
    try:
        body = client.get_object(Bucket=location.bucket, Key=location.key(MANIFEST_NAME))["Body"].read()
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
            log.info("%s has no %s: no upload into it completed, so it holds no checkpoint", location, MANIFEST_NAME)
            return None
        raise
    manifest = load_manifest(body, f"{location}/{MANIFEST_NAME}")
    sizes: dict[str, int] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=location.bucket, Prefix=location.list_prefix):
        for obj in page.get("Contents", []):
            sizes[location.relative(obj["Key"])] = obj["Size"]
    steps = {s for rel in manifest if (s := step_of(rel.split("/", 1)[0])) is not None}
    complete = {step: bool(manifest_step_complete(manifest, step, required_subdir, sizes.get)) for step in steps}
    tracker = None
    if TRACKER_FILE in manifest and sizes.get(TRACKER_FILE) == manifest[TRACKER_FILE].size:
        tracker = client.get_object(Bucket=location.bucket, Key=location.key(TRACKER_FILE))["Body"].read().decode("utf-8", "replace")
    step = choose_step(tracker, complete, str(location))
    return None if step is None else f"{location}/global_step_{step}"
