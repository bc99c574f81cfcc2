"""One training step's rollout and one validation, as ``RayPPOTrainer`` runs them, on scripted rollouts.

The trainer is verl's ``RayPPOTrainer`` built from the stage's composed config, the datasets
``create_rl_dataset`` loaded and the reward managers ``load_reward_manager`` builds, exactly as
``main_ppo.TaskRunner.run`` builds it; only ``init_workers`` (Ray, GPUs) is left out and its
``async_rollout_manager`` is :class:`retool.preflight.agent.InProcessRollout` (through a
:class:`retool.preflight.batch.RecordingRollout`).

- Validation is the trainer's own ``_validate()``: dataloader, repeat by ``val_kwargs.n``, padding
  to the agent workers, rollout, ``union``, the validation reward, the per-sample dump (eval) and
  ``process_validation_metrics``. Its dataset is one prompt per eval set.
- The training step cannot be called on its own (``fit`` loops, checkpoints and updates the actor),
  so :func:`training_step` repeats ``fit``'s lines from the batch to the reward (verl 0.6.1,
  ``ray_trainer.py`` 1016-1162; the lines shared with 0.9.1 are :func:`retool.preflight.batch.training_step`)
  and calls the trainer's own methods where ``fit`` does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from omegaconf import DictConfig
from verl.trainer.main_ppo import create_rl_sampler
from verl.trainer.ppo.ray_trainer import RayPPOTrainer, ResourcePoolManager, Role
from verl.trainer.ppo.reward import compute_reward, load_reward_manager
from verl.utils.dataset.rl_dataset import collate_fn

from retool.preflight.batch import RecordingRollout, StepResult, one_per_source, step_rows
from retool.preflight.batch import training_step as shared_training_step

__all__ = ["RecordingRollout", "StepResult", "build_trainer", "one_per_source", "step_rows", "training_step"]


def build_trainer(
    config: DictConfig, tokenizer: Any, train_dataset: Any, val_dataset: Any, rollout: RecordingRollout, trainer_class: type[RayPPOTrainer] | None = None
) -> RayPPOTrainer:
    """The stage's trainer as ``TaskRunner.run`` builds it, with the in-process rollout as its async rollout manager.

    ``trainer_class``: the stages run :class:`retool.recipe.verl_plugins.trainer.RetoolPPOTrainer` (the default);
    verl's ``RayPPOTrainer`` is what it extends."""
    if trainer_class is None:
        from retool.recipe.verl_plugins.trainer import RetoolPPOTrainer

        trainer_class = RetoolPPOTrainer
    reward_kwargs = config.reward_model.get("reward_kwargs", {})
    reward_fn = load_reward_manager(config, tokenizer, num_examine=0, **reward_kwargs)
    val_reward_fn = load_reward_manager(config, tokenizer, num_examine=1, **reward_kwargs)
    pool = ResourcePoolManager(resource_pool_spec={"global_pool": [config.trainer.n_gpus_per_node] * config.trainer.nnodes}, mapping={Role.ActorRollout: "global_pool"})
    trainer = trainer_class(
        config=config,
        tokenizer=tokenizer,
        processor=None,
        role_worker_mapping={Role.ActorRollout: object},
        resource_pool_manager=pool,
        reward_fn=reward_fn,
        val_reward_fn=val_reward_fn,
        train_dataset=train_dataset,
        val_dataset=val_dataset,
        collate_fn=collate_fn,
        train_sampler=create_rl_sampler(config.data, train_dataset),
    )
    # What init_workers sets in async mode, and fit before validating.
    trainer.async_rollout_mode = True
    trainer.async_rollout_manager = rollout
    trainer.global_steps = 0
    return trainer


def training_step(trainer: RayPPOTrainer, dataset: Any, rows: Sequence[int]) -> StepResult:
    """``fit``'s path from a batch to its scored rollouts (verl 0.6.1 ``ray_trainer.py`` 1016-1162): the
    shared lines of :func:`retool.preflight.batch.training_step`, scored by ``compute_reward(batch, reward_fn)``."""
    return shared_training_step(trainer, dataset, rows, score=lambda batch: compute_reward(batch, trainer.reward_fn))
