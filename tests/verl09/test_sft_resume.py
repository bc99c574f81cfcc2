"""The epoch-boundary SFT resume (verl issue #7401) on verl 0.9.1's engine SFT trainer, and its guard.

What runs is verl 0.9.1's own code (``verl/trainer/sft_trainer.py``: ``SFTTrainer.fit``, the
``DistributedSampler`` + ``StatefulDataLoader`` its ``_build_dataloader`` builds, and
``verl/utils/checkpoint/checkpoint_handler.py``: ``CheckpointHandler.save_checkpoint`` writing
``data_<dp rank>.pt`` inside ``fit``'s step loop, ``load_checkpoint`` / ``_determine_resume_path`` /
``_load_dataloader_state`` restoring it). Only what needs a model is replaced: the engine writes one
small file per checkpoint, and ``train_batch`` records the sample indices of its batch (a step that
raises stands for a pod lost after the previous checkpoint).

verl 0.9.1 has 0.6.1's bug: resumed from the checkpoint that ends an epoch, the restored loader is
exhausted, so that epoch trains nothing and ``fit`` returns without reaching its last step. The
stage's guard (``retool.runtime.sft_resume``: a view of the checkpoint without its loader state)
makes the retry train exactly the remaining steps, as on 0.6.1 (tests/stage/test_sft_resume.py).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import OmegaConf
from torch.utils.data import DistributedSampler
from torchdata.stateful_dataloader import StatefulDataLoader
from verl.trainer import sft_trainer
from verl.trainer.sft_trainer import SFTTrainer
from verl.utils.checkpoint.checkpoint_handler import CheckpointHandler, OrchestrationMode

from retool.runtime import sft_resume
from retool.runtime.sft_plan import SFTPlan

ROWS, BATCH, EPOCHS = 8, 4, 3
STEPS_PER_EPOCH = ROWS // BATCH
PLAN = SFTPlan(rows=ROWS, data_parallel=1, per_rank_batch=BATCH, steps_per_epoch=STEPS_PER_EPOCH, epochs=EPOCHS, save_freq=STEPS_PER_EPOCH)


class LostError(RuntimeError):
    """The pod is gone."""


class Engine:
    """The engine's checkpoint calls and data-parallel queries, one rank (what ``fit`` and ``CheckpointHandler`` ask)."""

    def __init__(self) -> None:
        self.loaded: list[str] = []

    def save_checkpoint(self, local_path: str, global_step: int, max_ckpt_to_keep: Any = None) -> None:
        Path(local_path).mkdir(parents=True, exist_ok=True)
        Path(local_path, "model_world_size_1_rank_0.pt").write_bytes(b"weights")

    def load_checkpoint(self, path: str) -> None:
        self.loaded.append(path)

    def is_mp_src_rank_with_outputs(self) -> bool:
        return False  # no tracking, no metrics: fit's bookkeeping only

    def get_data_parallel_rank(self) -> int:
        return 0

    def get_data_parallel_size(self) -> int:
        return 1

    def get_data_parallel_group(self) -> None:
        return None


class Client:
    """``TrainingWorker`` as ``fit`` calls it: records each batch's sample indices."""

    def __init__(self, lost_at: int | None) -> None:
        self.lost_at = lost_at
        self.trained: list[list[int]] = []

    def train_batch(self, data: Any) -> None:
        if len(self.trained) + 1 == self.lost_at:
            raise LostError
        self.trained.append(data["input_ids"][:, 0].tolist())

    def step_profile(self) -> None:
        pass


def collate(indices: list[int]) -> dict[str, torch.Tensor]:
    return {"input_ids": torch.tensor(indices).unsqueeze(1), "attention_mask": torch.ones(len(indices), 1, dtype=torch.long)}


def trainer(checkpoints: Path, *, resume_mode: str = "auto", resume_from_path: str | None = None, lost_at: int | None = None) -> tuple[SFTTrainer, Client]:
    """``SFTTrainer`` with its own ``fit``, loader and checkpoint handler; what ``__init__`` builds from a model is set by hand."""
    config = OmegaConf.create(
        {
            "trainer": {"total_epochs": EPOCHS, "project_name": "p", "experiment_name": "e", "logger": ["console"]},
            "model": {"use_remove_padding": False},
            "data": {"use_dynamic_bsz": False, "max_token_len_per_gpu": 8192, "micro_batch_size_per_gpu": 2, "pad_mode": "right"},
        }
    )
    sft = SFTTrainer.__new__(SFTTrainer)
    sft.config, sft.rank, sft.device_name, sft.engine = config, 0, "cpu", Engine()
    sft.training_client = Client(lost_at)
    sft.model_config = OmegaConf.create({"tokenizer": {"pad_token_id": 0}})
    # SFTTrainer._build_dataloader, one data-parallel rank:
    sft.train_sampler = DistributedSampler(range(ROWS), shuffle=True, num_replicas=1, rank=0, drop_last=True)
    sft.train_dataloader = StatefulDataLoader(range(ROWS), batch_size=BATCH, sampler=sft.train_sampler, collate_fn=collate, num_workers=0, drop_last=True)
    sft.val_dataloader, sft.global_batch_size = None, BATCH
    # SFTTrainer._init_engine:
    sft.total_training_steps, sft.steps_per_epoch = len(sft.train_dataloader) * EPOCHS, len(sft.train_dataloader)
    sft.save_freq, sft.test_freq, sft.start_profile_step, sft.end_profile_step = STEPS_PER_EPOCH, -1, -1, -1
    # SFTTrainer._build_ckpt_handler + load_checkpoint:
    sft.ckpt_handler = CheckpointHandler(
        engine=sft.engine,
        train_dataloader=sft.train_dataloader,
        default_local_dir=str(checkpoints),
        resume_mode=resume_mode,
        resume_from_path=resume_from_path,
        mode=OrchestrationMode.RAY,  # one process, no torch.distributed barrier
    )
    sft.resume_global_step = sft.ckpt_handler.load_checkpoint()
    return sft, sft.training_client


def epoch_order(epoch: int) -> list[list[int]]:
    sampler = DistributedSampler(range(ROWS), shuffle=True, num_replicas=1, rank=0, drop_last=True)
    sampler.set_epoch(epoch)
    order = list(sampler)
    return [order[i : i + BATCH] for i in range(0, len(order), BATCH)]


def steps_saved(checkpoints: Path) -> list[int]:
    return sorted(int(p.name.removeprefix("global_step_")) for p in checkpoints.glob("global_step_*"))


def test_verl_0_9_1_skips_the_epoch_after_an_epoch_boundary_checkpoint_and_the_guard_resumes_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sft_trainer, "log_gpu_memory_usage", lambda *args, **kwargs: None)  # reads CUDA memory: a GPU's, not the loop's
    checkpoints = tmp_path / "checkpoints"
    uninterrupted = [batch for epoch in range(EPOCHS) for batch in epoch_order(epoch)]

    # attempt 1: lost at step 3, right after the checkpoint that ends epoch 1 (saved inside fit's step loop)
    first, client = trainer(checkpoints, lost_at=3)
    with contextlib.suppress(LostError):
        first.fit()
    assert client.trained == uninterrupted[:2] and steps_saved(checkpoints) == [2]
    assert sorted(p.name for p in (checkpoints / "global_step_2").iterdir()) == ["data_0.pt", "model_world_size_1_rank_0.pt"]
    assert sft_resume.boundary_step(str(checkpoints), PLAN) == 2, "the guard sees verl 0.9.1's loader state (data_<rank>.pt)"

    # verl resuming by itself restores the exhausted loader: epoch 2 trains nothing, fit returns at step 4 of 6
    unguarded_dir = tmp_path / "unguarded"
    unguarded_dir.mkdir()
    (unguarded_dir / "global_step_2").symlink_to(checkpoints / "global_step_2")
    (unguarded_dir / "latest_checkpointed_iteration.txt").write_text("2")
    unguarded, client = trainer(unguarded_dir)
    assert unguarded.resume_global_step == 2
    unguarded.fit()
    assert client.trained == epoch_order(2), "epoch 1's batches (the second epoch) were never trained"
    assert steps_saved(unguarded_dir) == [2, 4], "no checkpoint of the last step (6): the stage's completion check would fail it"

    # attempt 2 as the stage runs it: resume from the view without the loader state
    view = sft_resume.make_resume_view(str(checkpoints), 2, str(tmp_path / "resume"))
    assert sorted(p.name for p in Path(view).iterdir()) == ["model_world_size_1_rank_0.pt"]
    overrides = sft_resume.resume_overrides(view)
    guarded, client = trainer(checkpoints, resume_mode=overrides["trainer.resume_mode"], resume_from_path=overrides["trainer.resume_from_path"])
    assert guarded.engine.loaded == [view] and guarded.resume_global_step == 2
    guarded.fit()
    assert client.trained == uninterrupted[2:], "exactly the batches the uninterrupted run trains after step 2"
    assert steps_saved(checkpoints)[-1] == PLAN.total_steps
    assert (checkpoints / "global_step_2" / "data_0.pt").exists(), "the checkpoint itself is left as verl wrote it"


def test_a_mid_epoch_checkpoint_of_verl_0_9_1_keeps_its_loader_state(tmp_path: Path) -> None:
    step3 = tmp_path / "global_step_3"
    step3.mkdir()
    torch.save({}, step3 / "data_0.pt")
    (step3 / "model_world_size_1_rank_0.pt").write_bytes(b"weights")
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("3")
    assert sft_resume.boundary_step(str(tmp_path), PLAN) is None
    names = ("data.pt", "data_0.pt", "data_15.pt", "data_x.pt", "model_world_size_1_rank_0.pt")
    assert [name for name in names if sft_resume.is_loader_state(name)] == ["data.pt", "data_0.pt", "data_15.pt"]
