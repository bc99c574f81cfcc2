"""verl 0.6.1's SFT trainer loop on CPU with everything but the model real.

Run as ``python -m tests.stage.sft_resume_probe OUT.json KEY=VALUE...`` (Hydra overrides of
verl's ``sft_trainer`` config). What runs is verl's own code: the config composition,
``_normalize_config_bsz``, ``_build_dataloader`` (DistributedSampler + StatefulDataLoader with 8
workers), ``load_checkpoint`` / ``_determine_resume_path`` / ``_load_dataloader_state`` (the
resume), ``fit`` (epochs, steps, the last-step test, validation, saving) and ``save_checkpoint``
(data.pt, the tracker file). Only what needs a model on a GPU is replaced: ``training_step``
records the sample indices of its batch, ``validation_step`` returns 0, and the FSDP checkpoint
manager writes one small file per checkpoint. ``RETOOL_PROBE_CRASH_AT=N`` kills the process at
global step N, as a pod lost after step N-1's checkpoint.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.utils.data import Dataset

from tests.render.verl_config import compose_verl


class Indices(Dataset):
    def __init__(self, rows: int) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return self.rows

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"index": torch.tensor(i)}


class FileCheckpointManager:
    """Stands in for FSDPCheckpointManager: a rank-0 shard file per checkpoint, and the loads it saw."""

    def __init__(self) -> None:
        self.loaded: list[str] = []

    def save_checkpoint(self, local_path: str, global_step: int, max_ckpt_to_keep: int | None = None) -> None:
        os.makedirs(local_path, exist_ok=True)
        torch.save({"step": global_step}, os.path.join(local_path, "model_world_size_1_rank_0.pt"))

    def load_checkpoint(self, local_path: str) -> None:
        self.loaded.append(local_path)
        torch.load(os.path.join(local_path, "model_world_size_1_rank_0.pt"))


def main() -> None:
    from verl.trainer.fsdp_sft_trainer import FSDPSFTTrainer

    out, overrides = sys.argv[1], sys.argv[2:]
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", os.environ.get("RETOOL_PROBE_PORT", "29517"))
    dist.init_process_group("gloo", rank=0, world_size=1)
    config = compose_verl("sft_trainer", overrides)
    rows = int(os.environ["RETOOL_PROBE_ROWS"])
    crash_at = int(os.environ.get("RETOOL_PROBE_CRASH_AT", "0"))

    trainer = FSDPSFTTrainer.__new__(FSDPSFTTrainer)
    trainer.config = config
    trainer.device_mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("fsdp",))
    trainer.ulysses_device_mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("dp", "sp"))
    trainer._normalize_config_bsz()
    trainer.config.ulysses_sequence_parallel_size = 1
    trainer._build_dataloader(Indices(rows), Indices(rows))
    trainer.lora = False
    trainer.resume_global_step = 0
    # what _build_model_optimizer sets besides the model
    trainer.steps_per_epoch = len(trainer.train_dataloader)
    trainer.total_steps = trainer.steps_per_epoch * trainer.config.trainer.total_epochs
    trainer.checkpoint_manager = FileCheckpointManager()
    resumed_from = trainer.load_checkpoint()
    trainer.device_name = "cpu"

    trained: list[dict] = []

    def training_step(batch) -> dict[str, float]:
        step = (trained[-1]["step"] if trained else trainer.resume_global_step) + 1
        if step == crash_at:
            os._exit(137)
        trained.append({"step": step, "indices": batch["index"].tolist()})
        return {"train/loss": 0.0, "train/lr(1e-3)": 0.0, "train/time(s)": 0.0}

    trainer.training_step = training_step
    trainer.validation_step = lambda batch: torch.tensor(0.0)
    trainer.fit()
    with open(out, "w") as f:
        json.dump({"steps_per_epoch": trainer.steps_per_epoch, "resumed_from": resumed_from, "loaded": trainer.checkpoint_manager.loaded, "trained": trained}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
