"""Did a stage do its work? Checked after its command exits 0, before anything reports success.

A trainer can exit 0 without finishing (verl 0.6.1's SFT trainer after an epoch-boundary resume
skips epochs and returns; a loader that runs dry ends the PPO loop early), so exit status alone
must never make a stage Succeeded. The expectations are pure functions of the run (and, for
SFT, of the prepared data's size); ``unmet`` reads the PVC and returns the reason or None.
"""

from __future__ import annotations

import logging
import os
import posixpath
from dataclasses import dataclass

from retool.runtime.paths import run_paths
from retool.runtime.sft_plan import SFTPlan
from retool.spec.model import RetoolRun
from retool.storage.steps import NoCheckpointError, latest_step

log = logging.getLogger(__name__)

EVAL_DUMP = "0.jsonl"
"""verl's validation dump of a val_only run (step 0) under trainer.validation_data_dir."""


@dataclass(frozen=True)
class Expectation:
    stage: str
    checkpoints: str | None = None
    checkpoint_subdir: str = ""
    final_step: int | None = None
    """The last global step verl plans, and the step of the checkpoint it must leave."""
    eval_dump: str | None = None
    eval_sets: tuple[str, ...] = ()
    eval_metric: str | None = None
    """The metric every eval set must have (``mean@n``)."""


def expectation(run: RetoolRun, stage: str, sft: SFTPlan | None = None) -> Expectation:
    paths, spec = run_paths(run), run.spec
    if stage == "sft":
        if sft is None:
            raise ValueError("the sft expectation needs the SFT plan (the prepared data's size)")
        return Expectation(stage, checkpoints=paths.sft_checkpoints, final_step=sft.total_steps)
    if stage == "rl":
        # verl's PPO loop ends at trainer.total_training_steps, which is rendered as rl.steps, and saves there.
        return Expectation(stage, checkpoints=paths.rl_checkpoints, checkpoint_subdir="actor", final_step=spec.rl.steps)
    if stage == "eval":
        return Expectation(
            stage, eval_dump=posixpath.join(paths.eval_output, EVAL_DUMP), eval_sets=tuple(d.name for d in spec.data.eval), eval_metric=f"mean@{spec.eval.samples_per_problem}"
        )
    return Expectation(stage)


def eval_results(dump: str) -> dict[str, dict[str, float]]:
    """Per-source scores of verl's validation dump, computed as the eval report computes them."""
    from retool.recipe.metrics import results_by_source, samples_from_rows, validation_metrics
    from retool.tracking.evaluation import read_sample_rows

    rows = read_sample_rows(dump)
    if not rows:
        return {}
    return results_by_source(validation_metrics(*samples_from_rows(rows)))


def unmet(expected: Expectation) -> str | None:
    """Why the stage did not do its work, or None when it did."""
    if expected.checkpoints is not None and expected.final_step is not None:
        try:
            step = latest_step(expected.checkpoints, expected.checkpoint_subdir)
        except NoCheckpointError as err:
            return f"the {expected.stage} trainer exited 0 but left no checkpoint: {err}"
        if step != expected.final_step:
            return (
                f"the {expected.stage} trainer exited 0 but its final checkpoint is global_step_{step}, "
                f"not global_step_{expected.final_step} (the planned total): it stopped early"
            )
    if expected.eval_dump is not None:
        if not os.path.isfile(expected.eval_dump):
            return f"the eval run exited 0 but wrote no per-sample results ({expected.eval_dump})"
        try:
            results = eval_results(expected.eval_dump)
        except (OSError, ValueError) as err:
            return f"the eval run's per-sample results ({expected.eval_dump}) are unreadable: {err}"
        missing = [name for name in expected.eval_sets if expected.eval_metric not in results.get(name, {})]
        if missing:
            return f"the eval run exited 0 but has no {expected.eval_metric} for {', '.join(missing)} (scored: {', '.join(sorted(results)) or 'nothing'})"
    return None
