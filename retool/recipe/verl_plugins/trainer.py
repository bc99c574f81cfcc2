"""verl 0.6.1's ``RayPPOTrainer`` with the tool-use dynamics and the reward watch of every scored batch.

Where the figures come from: ``fit`` scores each training batch with ``compute_reward(batch,
self.reward_fn)`` and ``_validate`` each validation batch with ``self.val_reward_fn(batch,
return_dict=True)`` (``ray_trainer.py``, verl 0.6.1). Both callables are attributes of the trainer,
so this subclass wraps them (:class:`ScoringProbe`): the wrapper passes the call through unchanged
and then hands the scored batch - responses, masks, the agent loop's ``retool_tools`` records,
the scores - to :class:`retool.recipe.verl_plugins.watch.BatchWatcher`.

- Validation (RL validation rounds and the eval stage, which is ``val_only``): ``_validate`` is
  overridden to collect every batch of the round and return the dynamics with verl's metrics, so
  verl's own logger writes ``val-tool/...`` at the trainer's step beside ``val-core/...``.
- Training steps: ``fit`` keeps its metrics dict to itself, so the ``tool/...`` metrics of step N
  are written by the watcher to the same MLflow run at step N (verl's logger started that run in
  this process; see :mod:`retool.recipe.verl_plugins.watch`).

Before the watcher, a training batch's sandbox-failed trajectories are left out of the advantages and
the loss (:mod:`retool.recipe.verl_plugins.masking`): ``compute_reward`` runs before
``compute_log_prob`` and ``compute_advantage`` in 0.6.1's ``fit``, and the probe gets the batch itself.
That is the one thing here that may fail a step, on purpose: above ``rl.maxSandboxFailureShare``. Any
other error in the probe is logged and the reward passes through.
"""

from __future__ import annotations

import logging
from typing import Any

from verl.trainer.ppo import ray_trainer
from verl.trainer.ppo.ray_trainer import RayPPOTrainer

from retool.recipe.verl_plugins import save_notice
from retool.recipe.verl_plugins.masking import mask_training_batch, max_share_from_config
from retool.recipe.verl_plugins.watch import BatchWatcher

logger = logging.getLogger(__name__)


class ScoringProbe:
    """A reward manager's stand-in: returns exactly what ``inner`` returns, and shows the scored batch to the watcher."""

    def __init__(self, inner: Any, trainer: RetoolPPOTrainer, *, validate: bool) -> None:
        self.inner = inner
        self.trainer = trainer
        self.validate = validate

    def __call__(self, data: Any, return_dict: bool = False) -> Any:
        result = self.inner(data, return_dict=return_dict)
        masked, outage = ({}, None) if self.validate else mask_training_batch(data, self.trainer.max_sandbox_failure_share, int(self.trainer.global_steps))
        try:
            scores = result["reward_tensor"] if isinstance(result, dict) else result
            extra = result.get("reward_extra_info", {}) if isinstance(result, dict) else {}
            self.trainer.watcher.observe(data, scores, extra, step=int(self.trainer.global_steps), validate=self.validate, also=masked)
        except Exception:  # the figures are a view on training, never a reason to stop it
            logger.exception("tool-use dynamics of a batch could not be computed")
        if outage is not None:
            raise outage
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class RetoolPPOTrainer(save_notice.SavesOnNotice, RayPPOTrainer):
    """``RayPPOTrainer`` whose scored batches also yield tool-use dynamics and reward-watch figures."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.watcher = BatchWatcher.from_config(self.config, self.tokenizer)
        self.max_sandbox_failure_share = max_share_from_config(self.config)
        # verl's save decision at each step's end (the module global fit calls): also yes on the operator's request.
        self.save_notice = save_notice.install(ray_trainer)
        if self.reward_fn is not None:
            self.reward_fn = ScoringProbe(self.reward_fn, self, validate=False)
        if self.val_reward_fn is not None:
            self.val_reward_fn = ScoringProbe(self.val_reward_fn, self, validate=True)

    def _validate(self) -> dict[str, Any]:
        self.watcher.start_validation()
        metrics = super()._validate()
        try:
            metrics.update(self.watcher.finish_validation(step=int(self.global_steps)))
        except Exception:
            logger.exception("validation tool-use dynamics could not be computed")
        return metrics

    def fit(self) -> None:
        try:
            super().fit()
        finally:
            self.watcher.close()
