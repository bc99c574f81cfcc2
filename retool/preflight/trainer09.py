"""One training step's rollout and one validation, as verl 0.9.1's legacy ``RayPPOTrainer`` runs them, on scripted rollouts.

The 0.9 line's stages run :class:`retool.recipe.verl_plugins.v0_9.trainer.RetoolPPOTrainer` (verl
0.9.1's ``RayPPOTrainer``, ``trainer.use_v1=false``). It is built here as ``main_ppo_v0.TaskRunner.run``
builds it (``verl/trainer/main_ppo_v0.py``: the datasets ``create_rl_dataset`` loaded, ``collate_fn``,
``create_rl_sampler``; no ``reward_fn`` on 0.9.1); only ``init_workers`` (Ray, GPUs, the reward
loop manager, the checkpoint manager) is left out, and its ``async_rollout_manager`` is
:class:`retool.preflight.agent09.InProcessRollout09` through a recording wrapper.

- Validation is the trainer's own ``_validate()`` (``verl/trainer/ppo/ray_trainer.py``): dataloader,
  repeat by ``val_kwargs.n``, padding to ``rollout.agent.num_workers``, the rollout (scored by the
  reward loop while it runs), ``union``, ``extract_reward``, the per-sample dump and
  ``process_validation_metrics``. ``use_rm`` is false for a rule-based reward, so the colocated
  reward path (``checkpoint_manager``) is not taken, as in the run.
- :func:`training_step` repeats ``RayPPOTrainer.fit``'s lines from the batch to the reward: the
  lines shared with 0.6.1 (:func:`retool.preflight.batch.training_step`) plus 0.9.1's own: the
  batch's ``temperature``, the ``global_token_num`` and ``images_seqlens`` meta (``fit`` iterates
  ``multi_modal_inputs``) and the scores read back with ``extract_reward(batch)`` through the module
  global ``ray_trainer.extract_reward`` (our trainer's probe, as in ``fit``). ``fit``'s
  ``_balance_batch`` needs the actor worker group's data-parallel size and is left out (it reorders
  the batch, changing no column).

Building ``RetoolPPOTrainer`` binds ``ray_trainer.extract_reward`` to its probe for the process
(what a trainer process does once); :func:`trainer_scope` restores verl's function afterwards, since
the preflight is not a trainer process.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from omegaconf import DictConfig
from verl import DataProto
from verl.trainer.ppo import ray_trainer
from verl.trainer.ppo.ray_trainer import RayPPOTrainer, ResourcePoolManager
from verl.trainer.ppo.utils import Role, create_rl_sampler
from verl.utils.dataset.rl_dataset import collate_fn

from retool.preflight.batch import RecordingRollout, StepResult
from retool.preflight.batch import training_step as shared_training_step


def build_trainer(
    config: DictConfig, tokenizer: Any, train_dataset: Any, val_dataset: Any, rollout: RecordingRollout, trainer_class: type[RayPPOTrainer] | None = None
) -> RayPPOTrainer:
    """The stage's trainer as ``main_ppo_v0.TaskRunner.run`` builds it (verl 0.9.1), with the in-process rollout as its async rollout manager."""
    if trainer_class is None:
        from retool.recipe.verl_plugins.v0_9.trainer import RetoolPPOTrainer

        trainer_class = RetoolPPOTrainer
    pool = ResourcePoolManager(resource_pool_spec={"global_pool": [config.trainer.n_gpus_per_node] * config.trainer.nnodes}, mapping={Role.ActorRollout: "global_pool"})
    trainer = trainer_class(
        config=config,
        tokenizer=tokenizer,
        processor=None,
        role_worker_mapping={Role.ActorRollout: object},
        resource_pool_manager=pool,
        train_dataset=train_dataset,
        val_dataset=val_dataset,
        collate_fn=collate_fn,
        train_sampler=create_rl_sampler(config.data, train_dataset),
    )
    # What init_workers sets (verl 0.9.1 always runs the agent loop), and fit before validating.
    trainer.async_rollout_manager = rollout
    trainer.global_steps = 0
    return trainer


def training_step(trainer: RayPPOTrainer, dataset: Any, rows: Sequence[int]) -> StepResult:
    """``fit``'s path from a batch to its scored rollouts on verl 0.9.1 (see the module docstring)."""
    config = trainer.config

    def on_batch(batch: DataProto) -> None:
        batch.meta_info["temperature"] = config.actor_rollout_ref.rollout.temperature

    def before_score(batch: DataProto) -> None:
        import torch

        batch.meta_info["global_token_num"] = torch.sum(batch.batch["attention_mask"], dim=-1).tolist()
        images_seqlens: list[int] = []
        for multi_modal_input in batch.non_tensor_batch["multi_modal_inputs"]:
            if "image_grid_thw" in multi_modal_input:
                images_seqlens.extend(multi_modal_input["images_seqlens"].tolist())
        batch.meta_info["images_seqlens"] = images_seqlens
        if trainer.use_rm and "rm_scores" not in batch.batch.keys():  # noqa: SIM118
            raise RuntimeError("the rollout left no rm_scores and the run scores with a colocated reward model, which the preflight cannot run")

    return shared_training_step(trainer, dataset, rows, score=lambda batch: ray_trainer.extract_reward(batch), on_batch=on_batch, before_score=before_score)


@contextmanager
def trainer_scope() -> Iterator[None]:
    """Restore ``ray_trainer.extract_reward`` after the trainer (see the module docstring)."""
    original = ray_trainer.extract_reward
    try:
        yield
    finally:
        ray_trainer.extract_reward = original
