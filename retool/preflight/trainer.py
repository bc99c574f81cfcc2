"""One training step's rollout and one validation, as ``RayPPOTrainer`` runs them, on scripted rollouts.

The trainer is verl's ``RayPPOTrainer`` built from the stage's composed config, the datasets
``create_rl_dataset`` loaded and the reward managers ``load_reward_manager`` builds, exactly as
``main_ppo.TaskRunner.run`` builds it; only ``init_workers`` (Ray, GPUs) is left out and its
``async_rollout_manager`` is :class:`retool.preflight.agent.InProcessRollout`.

- Validation is the trainer's own ``_validate()``: dataloader, repeat by ``val_kwargs.n``, padding
  to the agent workers, rollout, ``union``, the validation reward, the per-sample dump (eval) and
  ``process_validation_metrics``. Its dataset is one prompt per eval set.
- The training step cannot be called on its own (``fit`` loops, checkpoints and updates the actor),
  so :func:`training_step` repeats ``fit``'s lines from the batch to the reward (verl 0.6.1,
  ``ray_trainer.py`` 1016-1162) and calls the trainer's own methods where ``fit`` does.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from omegaconf import DictConfig
from torch.utils.data import Subset
from verl import DataProto
from verl.trainer.main_ppo import create_rl_sampler
from verl.trainer.ppo.ray_trainer import RayPPOTrainer, ResourcePoolManager, Role, compute_response_mask
from verl.trainer.ppo.reward import compute_reward, load_reward_manager
from verl.utils.dataset.rl_dataset import collate_fn

from retool.preflight.agent import InProcessRollout
from retool.preflight.data import Prompt


class RecordingRollout:
    """Delegates to an :class:`InProcessRollout` and keeps every output, so checks can tell a failed
    rollout from a failure after it (the trainer's ``union``) and look at what the rollout produced."""

    def __init__(self, rollout: InProcessRollout) -> None:
        self.rollout = rollout
        self.outputs: list[DataProto] = []

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        output = self.rollout.generate_sequences(prompts)
        self.outputs.append(output)
        return output


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


def one_per_source(dataset: Any, prompts: Sequence[Prompt]) -> Subset:
    return Subset(dataset, [p.index for p in prompts])


def step_rows(prompts: Sequence[Prompt], repeats: int, workers: int) -> list[int]:
    """Dataset rows for a training step: every source's prompt, cycled until ``rows x repeats`` splits
    evenly between the agent workers (``AgentLoopManager`` asserts equal chunks)."""
    per = workers // math.gcd(workers, repeats)
    count = math.lcm(len(prompts), per)
    return [prompts[i % len(prompts)].index for i in range(count)]


@dataclass
class StepResult:
    batch: DataProto
    reward_extra_keys: list[str] = field(default_factory=list)


def training_step(trainer: RayPPOTrainer, dataset: Any, rows: Sequence[int]) -> StepResult:
    """``fit``'s path from a batch to its scored rollouts (generation, union, response mask, reward)."""
    config = trainer.config
    batch = DataProto.from_single_dict(collate_fn([dataset[i] for i in rows]))
    batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch.batch))], dtype=object)
    gen_batch = trainer._get_gen_batch(batch)
    gen_batch.meta_info["global_steps"] = 1
    gen_batch_output = gen_batch.repeat(repeat_times=config.actor_rollout_ref.rollout.n, interleave=True)
    gen_batch_output = trainer.async_rollout_manager.generate_sequences(gen_batch_output)
    gen_batch_output.meta_info.pop("timing", None)
    batch = batch.repeat(repeat_times=config.actor_rollout_ref.rollout.n, interleave=True)
    batch = batch.union(gen_batch_output)
    if "response_mask" not in batch.batch.keys():  # noqa: SIM118  (as fit writes it: TensorDict membership)
        batch.batch["response_mask"] = compute_response_mask(batch)
    reward_tensor, reward_extra_infos_dict = compute_reward(batch, trainer.reward_fn)
    batch.batch["token_level_scores"] = reward_tensor
    if reward_extra_infos_dict:
        batch.non_tensor_batch.update({k: np.array(v) for k, v in reward_extra_infos_dict.items()})
    return StepResult(batch=batch, reward_extra_keys=list(reward_extra_infos_dict))
