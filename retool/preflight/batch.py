"""The trainer-batch path both verl lines share: a training step's batch from rows to scored rollouts.

``RayPPOTrainer.fit`` builds a step's batch the same way on verl 0.6.1 and 0.9.1 (``ray_trainer.py``
of each: collate, ``uid``, ``_get_gen_batch``, repeat by ``rollout.n``, the rollout, ``union``, the
response mask); what differs is a few lines around it and how the batch is scored (0.6.1
``compute_reward(batch, reward_fn)``, 0.9.1 ``extract_reward(batch)`` of the scores the reward loop
wrote during the rollout). :func:`training_step` runs the shared lines with the line's own as
arguments; :mod:`retool.preflight.trainer` (0.6.1) and :mod:`retool.preflight.trainer09` (0.9.1)
bind them. Only what both lines have is imported (``DataProto``, ``collate_fn``,
``compute_response_mask``).
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from torch.utils.data import Subset
from verl import DataProto
from verl.trainer.ppo.ray_trainer import compute_response_mask
from verl.utils.dataset.rl_dataset import collate_fn

from retool.preflight.data import Prompt


class RecordingRollout:
    """Delegates to an in-process rollout and keeps every output, so checks can tell a failed
    rollout from a failure after it (the trainer's ``union``) and look at what the rollout produced."""

    def __init__(self, rollout: Any) -> None:
        self.rollout = rollout
        self.outputs: list[DataProto] = []

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        output = self.rollout.generate_sequences(prompts)
        self.outputs.append(output)
        return output


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


def training_step(
    trainer: Any,
    dataset: Any,
    rows: Sequence[int],
    *,
    score: Callable[[DataProto], tuple[Any, dict[str, Any]]],
    on_batch: Callable[[DataProto], None] | None = None,
    before_score: Callable[[DataProto], None] | None = None,
) -> StepResult:
    """``fit``'s path from a batch to its scored rollouts: generation, union, response mask, reward.

    ``on_batch``: the line's lines right after the batch is built; ``before_score``: its lines between
    the response mask and the reward; ``score``: how its ``fit`` gets the reward tensor and extras."""
    config = trainer.config
    batch = DataProto.from_single_dict(collate_fn([dataset[i] for i in rows]))
    if on_batch is not None:
        on_batch(batch)
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
    if before_score is not None:
        before_score(batch)
    reward_tensor, reward_extra_infos_dict = score(batch)
    batch.batch["token_level_scores"] = reward_tensor
    if reward_extra_infos_dict:
        batch.non_tensor_batch.update({k: np.array(v) for k, v in reward_extra_infos_dict.items()})
    return StepResult(batch=batch, reward_extra_keys=list(reward_extra_infos_dict))
