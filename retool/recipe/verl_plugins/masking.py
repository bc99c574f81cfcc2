"""Leaving a step's sandbox-failed trajectories out of verl's advantages and loss: both lines, one place.

The decision is :mod:`retool.recipe.sandbox_failures`; this applies it to verl's ``DataProto`` where
both lines' trainers see the scored batch (the probes of :mod:`retool.recipe.verl_plugins.trainer` and
:mod:`retool.recipe.verl_plugins.v0_9.trainer`), after the reward and before ``_compute_old_log_prob``
and ``compute_advantage`` (``RayPPOTrainer.fit``, ``verl/trainer/ppo/ray_trainer.py``, 0.6.1 and 0.9.1).
Two changes, both through what verl itself reads:

- ``response_mask`` of a masked row becomes all zeros. Every loss term verl computes is aggregated
  over that mask (``agg_loss`` in ``core_algos.py``: the policy loss, the KL loss, the entropy term,
  the critic's value loss), so the row contributes nothing; sequence-mean modes skip fully masked
  rows by name ("exclude fully masked sequences", both versions). Response-length metrics read the
  attention mask and still count the row.
- its ``uid`` (verl's GRPO group id) becomes one of its own, so ``compute_grpo_outcome_advantage``
  leaves its score out of its old group's mean and std (and RLOO out of its leave-one-out baseline).

Nothing else of the batch changes: the row is still in it (verl's mini-batches and data-parallel
split need the batch size), it is only worth nothing.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from retool.recipe.dynamics import RECORD_KEY
from retool.recipe.sandbox_failures import SandboxOutageError, check_share, decide_mask

CONFIG_KEY = "sandbox_failures"
"""Under our ``retool`` key in verl's config (rendered as ``+retool.sandbox_failures.max_share``)."""
DEFAULT_MAX_SHARE = 0.25
"""``rl.maxSandboxFailureShare``'s default, for a config rendered before the key existed."""
LEFT_OUT_UID_SUFFIX = "/left-out-"


def max_share_from_config(config: Any) -> float:
    ours = config.get("retool") or {}
    section = ours.get(CONFIG_KEY) or {}
    return float(section.get("max_share", DEFAULT_MAX_SHARE))


def mask_sandbox_failures(data: Any, *, max_share: float, step: int) -> dict[str, float]:
    """Leave the step's sandbox-failed trajectories (and their groups' lone survivors) out of ``data``, in place.

    Returns the step's masking metrics (empty for a batch without the agent loop's records: the
    text-only baseline never calls the tool). Raises
    :class:`~retool.recipe.sandbox_failures.SandboxOutageError` above ``max_share``,
    before anything is changed.
    """
    records = data.non_tensor_batch.get(RECORD_KEY)
    if records is None:
        return {}
    uids = data.non_tensor_batch.get("uid")
    if uids is None:  # fit always sets it; without it every row is a group of its own
        uids = np.array([f"row-{i}" for i in range(len(records))], dtype=object)
    decision = decide_mask(list(records), list(uids))
    check_share(decision, max_share, step=step)
    rows = np.flatnonzero(decision.masked)
    if rows.size:
        mask = data.batch["response_mask"]
        mask[torch.as_tensor(rows, device=mask.device)] = 0
        relabelled = np.array(uids, dtype=object)
        for row in rows:
            relabelled[row] = f"{uids[row]}{LEFT_OUT_UID_SUFFIX}{row}"
        data.non_tensor_batch["uid"] = relabelled
    return decision.metrics()


def mask_training_batch(data: Any, max_share: float, step: int) -> tuple[dict[str, float], SandboxOutageError | None]:
    """What both lines' probes call on a training batch: (the masking metrics, the error to raise once they are logged)."""
    try:
        return mask_sandbox_failures(data, max_share=max_share, step=step), None
    except SandboxOutageError as exc:
        return exc.metrics, exc
