"""verl 0.9.1's legacy ``RayPPOTrainer`` with the tool-use dynamics and the reward watch of every scored batch.

Where the scores are on this line: verl 0.9.1 has no ``reward_fn``/``val_reward_fn`` on the trainer
and no ``compute_reward``; the reward loop scores each sample while the agent loop runs, and both
``fit`` and ``_validate`` read the scored batch back through ``extract_reward(batch)`` - the name
``verl.trainer.ppo.ray_trainer`` imports from ``verl.trainer.ppo.reward`` (verl 0.9.1
``ray_trainer.py``). :class:`RetoolPPOTrainer` binds that name, in the trainer's own process, to a
probe that returns exactly what verl's function returns and shows the batch to the same
:class:`retool.recipe.verl_plugins.watch.BatchWatcher` the 0.6 line uses; ``_validate`` marks the
batches it reads as validation. Before the watcher, a training batch's sandbox-failed trajectories are
left out of the advantages and the loss (:mod:`retool.recipe.verl_plugins.masking`; ``extract_reward``
runs before ``_compute_old_log_prob`` and ``compute_advantage`` in 0.9.1's ``fit``): the one thing here
that fails a step, on purpose, above ``rl.maxSandboxFailureShare``. Any other probe error is logged.
"""

from __future__ import annotations

import logging
from typing import Any

from verl.trainer.ppo import ray_trainer
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.trainer.ppo.reward import extract_reward

from retool.recipe.verl_plugins import save_notice
from retool.recipe.verl_plugins.masking import mask_training_batch, max_share_from_config
from retool.recipe.verl_plugins.watch import BatchWatcher

logger = logging.getLogger(__name__)


class ExtractRewardProbe:
    """Stands for ``extract_reward`` in ``ray_trainer``: verl's result, unchanged, after the watcher saw the batch."""

    def __init__(self, trainer: RetoolPPOTrainer, inner: Any = extract_reward) -> None:
        self.trainer = trainer
        self.inner = inner

    def __call__(self, batch: Any) -> Any:
        result = self.inner(batch)
        trainer = self.trainer
        masked, outage = ({}, None) if trainer.validating else mask_training_batch(batch, trainer.max_sandbox_failure_share, int(trainer.global_steps))
        try:
            scores, extra = result
            trainer.watcher.observe(batch, scores, extra, step=int(trainer.global_steps), validate=trainer.validating, also=masked)
        except Exception:  # the figures are a view on training, never a reason to stop it
            logger.exception("tool-use dynamics of a batch could not be computed")
        if outage is not None:
            raise outage
        return result


class RetoolPPOTrainer(save_notice.SavesOnNotice, RayPPOTrainer):
    """``RayPPOTrainer`` (verl 0.9.1, ``trainer.use_v1=false``) whose scored batches also yield the dynamics and the reward watch."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.watcher = BatchWatcher.from_config(self.config, self.tokenizer)
        self.max_sandbox_failure_share = max_share_from_config(self.config)
        # verl's save decision at each step's end (the module global fit calls): also yes on the operator's request.
        self.save_notice = save_notice.install(ray_trainer)
        self.validating = False
        # The module global verl's fit and _validate call; this process runs one trainer.
        ray_trainer.extract_reward = ExtractRewardProbe(self)

    def _validate(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self.watcher.start_validation()
        self.validating = True
        try:
            metrics = super()._validate(*args, **kwargs)
        finally:
            self.validating = False
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
