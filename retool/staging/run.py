"""Stage the run's model once: skip a complete copy of the same source, replace one of another."""

from __future__ import annotations

import logging
import os

from retool.staging import hub, s3
from retool.staging.manifest import StagedFile, StagedModel, read_staged, remove_staged, write_staged
from retool.staging.plan import StagingError, StagingPlan, check_model_files

log = logging.getLogger(__name__)


def _in_place(plan: StagingPlan) -> StagedModel:
    if not os.path.isdir(plan.source):
        raise StagingError(f"model.base {plan.source} does not exist on the run's PVC")
    names = [os.path.relpath(os.path.join(d, f), plan.source) for d, _, fs in os.walk(plan.source) for f in fs]
    check_model_files(names, plan.source)
    files = {name: StagedFile(size=os.path.getsize(os.path.join(plan.source, name))) for name in sorted(names)}
    return StagedModel(kind="pvc", source=plan.source, revision=None, commit=None, files=files)


def stage_model(plan: StagingPlan, *, token: str | None = None) -> StagedModel:
    """Make ``plan.destination`` hold the verified model; returns what it holds."""
    if not plan.copies:
        return _in_place(plan)
    existing = read_staged(plan.destination)
    if existing is not None and existing.same_source(plan.kind, plan.source, plan.revision):
        missing = [n for n, f in existing.files.items() if not os.path.isfile(os.path.join(plan.destination, n)) or os.path.getsize(os.path.join(plan.destination, n)) != f.size]
        if not missing:
            log.info("%s is already staged in %s (commit %s)", plan.source, plan.destination, existing.commit or "-")
            return existing
        log.warning("the staged copy in %s lost %d files (%s...): staging again", plan.destination, len(missing), missing[0])
    # The manifest goes first: from here on the directory is not a staged model until it is rewritten.
    remove_staged(plan.destination)
    if existing is not None and not existing.same_source(plan.kind, plan.source, plan.revision):
        log.info("%s holds %s, not %s: replacing it", plan.destination, existing.source, plan.source)
        hub.clear(plan.destination)
    staged = hub.stage_from_hub(plan, token=token) if plan.kind == "hub" else s3.stage_from_s3(plan)
    write_staged(plan.destination, staged)
    log.info("staged %s (%d files, %d bytes) in %s", plan.source, len(staged.files), staged.total_bytes, plan.destination)
    return staged
