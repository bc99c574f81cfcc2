"""The 0.9 line's program, trainer hook, dataset and reward on verl 0.9.1's own code, on CPU.

- ``main_ppo``: our task runner runs verl 0.9.1's legacy ``TaskRunner.run`` with our trainer bound in
  its process; a config asking for the V1 trainer is refused, naming the key.
- the trainer hook: verl 0.9.1's ``fit`` and ``_validate`` read every scored batch through the module
  global ``extract_reward`` (so that is where the watch is), and our probe returns exactly verl's
  result while the watcher computes the dynamics from the batch.
- the dataset: verl 0.9.1's ``create_rl_dataset`` with the rendered data config builds our class,
  measures prompts with the tool schema, drops the overlong ones and routes rows to ``tool_agent``.
- the reward: verl 0.9.1's reward-loop manager (``load_reward_manager`` + ``run_single``, what each
  ``RewardLoopWorker`` runs) scores a decoded response with our reward: +1 right, -1 wrong.
"""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf
from transformers import AutoTokenizer
from verl import DataProto
from verl.trainer import main_ppo_v0
from verl.trainer.ppo import ray_trainer
from verl.trainer.ppo.reward import extract_reward, load_reward_manager
from verl.trainer.ppo.utils import create_rl_dataset

from retool.data.schema import AGENT_NAME, rl_row
from retool.recipe.dynamics import RECORD_KEY, tool_record
from retool.recipe.render.command import hydra_overrides
from retool.recipe.verl_plugins.dataset import RetoolRLDataset, measure_fingerprint
from retool.recipe.verl_plugins.v0_9 import main_ppo
from retool.recipe.verl_plugins.v0_9.trainer import ExtractRewardProbe, RetoolPPOTrainer
from retool.recipe.verl_plugins.watch import BatchWatcher
from tests.render.verl_config import compose_verl
from tests.verl09.lines import rendered


def rl_config(**changes: object):
    command = rendered("smoke-qwen0.5b", "rl")
    return compose_verl("ppo_trainer", hydra_overrides({**command.overrides, **changes}))


# ------------------------------------------------------------------------------ the program


def test_the_task_runner_runs_verls_legacy_run_with_our_trainer(monkeypatch: pytest.MonkeyPatch) -> None:
    legacy = main_ppo.legacy_task_runner_class()
    assert legacy.run.__qualname__ == "TaskRunner.run" and legacy.__module__ == main_ppo_v0.__name__
    built = []
    monkeypatch.setattr(main_ppo_v0, "RayPPOTrainer", main_ppo_v0.RayPPOTrainer)  # restored after the test
    monkeypatch.setattr(legacy, "run", lambda self, config: built.append((main_ppo_v0.RayPPOTrainer, config)))
    main_ppo.RetoolTaskRunner().run("config")
    assert built == [(RetoolPPOTrainer, "config")]


def test_a_config_asking_for_the_v1_trainer_is_refused() -> None:
    main_ppo.check_legacy_trainer(rl_config())
    with pytest.raises(main_ppo.V1TrainerError, match=r"trainer.use_v1 is true"):
        main_ppo.check_legacy_trainer(rl_config(**{"trainer.use_v1": True}))


# ------------------------------------------------------------------------------ the trainer hook


def test_verls_trainer_reads_every_scored_batch_through_extract_reward() -> None:
    """Where the probe hooks in: if verl stops calling the module global, this fails before a run loses its figures."""
    assert ray_trainer.extract_reward is extract_reward
    assert "extract_reward(batch)" in inspect.getsource(ray_trainer.RayPPOTrainer.fit)
    assert "extract_reward(test_batch)" in inspect.getsource(ray_trainer.RayPPOTrainer._validate)


def scored_batch(tokenizer) -> DataProto:
    responses = torch.tensor([[11, 12, 13, 0], [21, 22, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    records = np.array(
        [tool_record(["ok"], [2], 1, hit_max_turns=False, outputs=["42"], response_tokens=3), tool_record([], [], None, hit_max_turns=False, outputs=[], response_tokens=2)],
        dtype=object,
    )
    attention = torch.cat([torch.ones(2, 2, dtype=torch.long), mask], 1)
    data = DataProto.from_dict(
        tensors={"responses": responses, "response_mask": mask, "attention_mask": attention, "rm_scores": torch.tensor([[0, 0, 1.0, 0], [0, -1.0, 0, 0]])},
        non_tensors={RECORD_KEY: records, "acc": np.array([1.0, 0.0]), "data_source": np.array(["aime_2024", "aime_2024"], dtype=object)},
        meta_info={"reward_extra_keys": ["acc"]},
    )
    return data


def test_the_probe_returns_verls_result_and_the_watcher_sees_the_batch(qwen_model: str) -> None:
    tokenizer = AutoTokenizer.from_pretrained(qwen_model)
    config = rl_config(**{"trainer.logger": ["console"], "+retool.reward_watch.share": 0.0})
    trainer = RetoolPPOTrainer.__new__(RetoolPPOTrainer)  # the probe reads only these attributes (validating: no masking)
    trainer.watcher, trainer.global_steps, trainer.validating = BatchWatcher.from_config(config, tokenizer), 3, True
    batch = scored_batch(tokenizer)
    trainer.watcher.start_validation()
    scores, extra = ExtractRewardProbe(trainer)(batch)
    expected_scores, expected_extra = extract_reward(batch)
    assert torch.equal(scores, expected_scores) and extra.keys() == expected_extra.keys()
    metrics = trainer.watcher.finish_validation(step=3)
    trainer.watcher.close()
    calls = {key: value for key, value in metrics.items() if "calls" in key}
    assert calls, f"the watcher computed the tool-use dynamics of the batch: {sorted(metrics)}"


def test_a_failing_watcher_never_fails_the_step(qwen_model: str) -> None:
    trainer = RetoolPPOTrainer.__new__(RetoolPPOTrainer)
    trainer.watcher, trainer.global_steps, trainer.validating = None, 1, False  # observe on None raises inside the probe
    trainer.max_sandbox_failure_share = 0.25
    batch = scored_batch(None)
    scores, _ = ExtractRewardProbe(trainer)(batch)
    assert torch.equal(scores, batch.batch["rm_scores"])


# ------------------------------------------------------------------------------ dataset and reward


def write_rows(path: Path, questions: list[str]) -> str:
    rows = [rl_row(data_source="aime_2024", question=q, ground_truth=str(i), index=i, split="test", source_id=None) for i, q in enumerate(questions)]
    pd.DataFrame(rows).to_parquet(path)
    return str(path)


def test_create_rl_dataset_builds_ours_measures_with_the_tool_schema_and_routes_to_tool_agent(qwen_model: str, tmp_path: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(qwen_model)
    short, long = "What is 1 + 1?", "Compute " + " + ".join(str(i) for i in range(400)) + "."
    files = write_rows(tmp_path / "rl.parquet", [short, long, short])
    config = rl_config(**{"data.max_prompt_length": 400})
    dataset = create_rl_dataset([files], config.data, tokenizer, None, is_train=True)
    assert isinstance(dataset, RetoolRLDataset)
    assert dataset.filter_report is not None and (dataset.filter_report.total, dataset.filter_report.kept) == (3, 2)
    assert all(dataset[i]["agent_name"] == AGENT_NAME for i in range(len(dataset)))
    # transformers 5's tokenizer keeps its serialized state: the measured lengths get our fingerprint, not a 6 s dill hash.
    assert measure_fingerprint("f", tokenizer, None, {}, "prompt") is not None


@pytest.mark.parametrize(("answer", "score"), [("\\boxed{42}", 1.0), ("\\boxed{41}", -1.0)])
def test_verls_reward_loop_manager_scores_with_our_reward(qwen_model: str, answer: str, score: float) -> None:
    tokenizer = AutoTokenizer.from_pretrained(qwen_model)
    config = rl_config()
    OmegaConf.resolve(config)

    async def score_one() -> dict:
        manager = load_reward_manager(config, tokenizer)
        ids = tokenizer.encode(f"So the answer is {answer}.", add_special_tokens=False)
        data = DataProto.from_dict(
            tensors={"responses": torch.tensor([ids]), "attention_mask": torch.ones(1, 2 + len(ids), dtype=torch.long), "prompts": torch.zeros(1, 2, dtype=torch.long)},
            non_tensors={
                "data_source": np.array(["aime_2024"], dtype=object),
                "reward_model": np.array([{"ground_truth": "42"}], dtype=object),
                "extra_info": np.array([{}], dtype=object),
            },
        )
        return await manager.run_single(data)

    result = asyncio.run(score_one())
    assert result["reward_score"] == score


def test_every_module_the_0_9_lines_stages_run_imports_as_its_image_build_checks() -> None:
    from retool.runtime import import_check

    assert import_check.main(["--line", "0.9.1"]) == 0
