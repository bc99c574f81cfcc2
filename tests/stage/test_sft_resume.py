"""SFT retries resume, and verl 0.6.1's epoch-boundary resume (verl issue #7401) is guarded.

The resume runs through verl's own trainer loop and loader restore on CPU
(``tests/stage/sft_resume_probe.py``): a run killed right after its epoch-boundary checkpoint,
retried the way verl resumes by itself (it skips an epoch and exits 0 early: the bug), and
retried the way the stage entrypoint resumes (it trains exactly the steps the uninterrupted run
would have, in the same order, and ends on the planned last step).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from retool.recipe.render.sft import STEPS_PER_EPOCH
from retool.recipe.render.stages import render_stage
from retool.runtime import completion, sft_resume
from retool.runtime.paths import run_paths
from retool.runtime.sft_plan import SFTPlanError, sft_plan
from retool.spec.validate import parse_run
from retool.stage import resolve_sft, resume_view_root
from tests.conftest import free_port, repo_env
from tests.render.cases import context_of, load_example

ROWS, BATCH, EPOCHS = 8, 4, 3


def small_run(tmp_path: Path, **sft: object):
    doc = load_example("minimal")
    doc["spec"].setdefault("storage", {}).setdefault("pvc", {})["mountPath"] = str(tmp_path / "pvc")
    doc["spec"]["hardware"] = {"devicesPerNode": 1}
    doc["spec"]["sft"] = {"batchSize": BATCH, "microBatchSizePerDevice": 2, "epochs": EPOCHS, "sequenceParallel": 1, **sft}
    doc["spec"]["rl"] = {"sequenceParallel": 1, "tensorParallel": 1, "batchSize": 4, "miniBatchSize": 4, "rolloutN": 2}
    run = parse_run(doc)
    train = Path(run_paths(run).sft_train)
    train.parent.mkdir(parents=True)
    pq.write_table(pa.table({"messages": [f"row {i}" for i in range(ROWS)]}), train)
    return run


# ------------------------------------------------------------------------------ the plan


@pytest.mark.parametrize(
    ("rows", "devices", "sp", "batch"),
    [(8, 1, 1, 4), (9, 1, 1, 4), (2000, 8, 4, 32), (2003, 8, 1, 32), (100, 16, 2, 16), (37, 8, 8, 8), (33, 4, 1, 32)],
    ids=lambda v: str(v),
)
def test_steps_per_epoch_are_what_verls_loader_yields(rows: int, devices: int, sp: int, batch: int) -> None:
    """verl's loader: DistributedSampler(num_replicas=dp, drop_last=True) batched by batch/dp with drop_last."""
    spec = load_example("minimal")["spec"]
    spec["hardware"] = {"devicesPerNode": devices}
    spec["sft"] = {"batchSize": batch, "microBatchSizePerDevice": 1, "sequenceParallel": sp, "epochs": 2}
    spec["rl"] = {"sequenceParallel": 1, "tensorParallel": 1}
    run = parse_run({"apiVersion": "retool.dev/v1alpha1", "kind": "RetoolRun", "metadata": {"name": "p"}, "spec": spec})
    dp = devices // sp
    loaders = [DataLoader(range(rows), batch_size=batch // dp, drop_last=True, sampler=DistributedSampler(range(rows), num_replicas=dp, rank=r, drop_last=True)) for r in range(dp)]
    assert {len(loader) for loader in loaders} == {sft_plan(run.spec, rows).steps_per_epoch}
    assert sft_plan(run.spec, rows).total_steps == len(loaders[0]) * 2


def test_data_smaller_than_one_step_is_refused_before_any_device_is_used(tmp_path: Path) -> None:
    run = small_run(tmp_path)
    with pytest.raises(SFTPlanError, match=r"the SFT data has 3 trajectories, fewer than one step of sft\.batchSize 4"):
        sft_plan(run.spec, 3)


def test_unset_save_frequency_is_once_per_epoch_and_an_explicit_one_is_kept(tmp_path: Path) -> None:
    run = small_run(tmp_path)
    command = render_stage(run, "sft", context_of(run))
    assert command.overrides["trainer.save_freq"] == STEPS_PER_EPOCH
    resolved, plan, boundary = resolve_sft(run, context_of(run), command)
    assert (plan.steps_per_epoch, plan.total_steps, boundary) == (2, 6, None)
    assert resolved.overrides["trainer.save_freq"] == 2 and "trainer.save_freq=2" in resolved.argv
    assert STEPS_PER_EPOCH not in " ".join(resolved.argv)
    explicit = small_run(tmp_path / "explicit", saveFreq=5)
    resolved, plan, _ = resolve_sft(explicit, context_of(explicit), render_stage(explicit, "sft", context_of(explicit)))
    assert resolved.overrides["trainer.save_freq"] == 5 == plan.save_freq


def test_save_frequency_zero_is_refused() -> None:
    doc = load_example("minimal")
    doc["spec"]["sft"] = {"saveFreq": 0}
    with pytest.raises(ValueError, match="0 is not a save frequency"):
        parse_run(doc)


# ------------------------------------------------------------------------------ verl's resume


def probe(out: Path, overrides: dict[str, object], crash_at: int = 0) -> tuple[int, dict]:
    args = [f"{key}={value}" for key, value in overrides.items()]
    env = repo_env(RETOOL_PROBE_ROWS=str(ROWS), RETOOL_PROBE_CRASH_AT=str(crash_at), RETOOL_PROBE_PORT=str(free_port()))
    result = subprocess.run([sys.executable, "-m", "tests.stage.sft_resume_probe", str(out), *args], env=env, capture_output=True, text=True, timeout=240, check=False)
    report = json.loads(out.read_text()) if out.exists() else {}
    if crash_at == 0:
        assert result.returncode == 0, result.stderr[-3000:]
    return result.returncode, report


def probe_overrides(command, checkpoints: str) -> dict[str, object]:
    """The rendered command's loader, epoch, save and resume settings; the rest is model plumbing the probe replaces."""
    keys = ("data.train_batch_size", "data.micro_batch_size_per_gpu", "trainer.total_epochs", "trainer.save_freq", "trainer.resume_mode", "trainer.resume_from_path")
    picked = {key: command.overrides[key] for key in keys if key in command.overrides}
    return {**picked, "trainer.default_local_dir": checkpoints, "trainer.logger": "[console]", "trainer.device": "cpu"}


def epoch_order(epoch: int) -> list[list[int]]:
    """The batches verl's sampler gives in ``epoch`` (shuffled by epoch, seed 0, one data-parallel rank)."""
    sampler = DistributedSampler(range(ROWS), num_replicas=1, rank=0, shuffle=True, drop_last=True)
    sampler.set_epoch(epoch)
    order = list(sampler)
    return [order[i : i + BATCH] for i in range(0, len(order) - BATCH + 1, BATCH)]


@pytest.mark.slow
def test_retry_after_an_epoch_boundary_checkpoint_trains_every_remaining_step(tmp_path: Path) -> None:
    run = small_run(tmp_path)
    ctx = context_of(run)
    checkpoints = run_paths(run).sft_checkpoints
    command, plan, _ = resolve_sft(run, ctx, render_stage(run, "sft", ctx))
    uninterrupted = [batch for epoch in range(EPOCHS) for batch in epoch_order(epoch)]

    # attempt 1: killed at step 3, right after the checkpoint that ends epoch 1
    status, _ = probe(tmp_path / "attempt1.json", probe_overrides(command, checkpoints), crash_at=3)
    assert status == 137 and sorted(p.name for p in Path(checkpoints).iterdir()) == ["global_step_2", "latest_checkpointed_iteration.txt"]
    copy = tmp_path / "unguarded"
    shutil.copytree(checkpoints, copy)

    # verl resuming by itself restores the exhausted loader: it skips epoch 2, exits 0 at step 4
    _, unguarded = probe(tmp_path / "unguarded.json", probe_overrides(command, str(copy)))
    assert unguarded["resumed_from"] == 2
    assert [s["step"] for s in unguarded["trained"]] == [3, 4]
    assert [s["indices"] for s in unguarded["trained"]] == epoch_order(2), "epoch 2's batches were never trained"
    unmet = completion.unmet(completion.Expectation("sft", checkpoints=str(copy), final_step=plan.total_steps))
    assert unmet is not None and "global_step_4, not global_step_6" in unmet

    # attempt 2 as the stage runs it: resume from the view without the exhausted loader state
    retry, plan, boundary = resolve_sft(run, ctx, render_stage(run, "sft", ctx))
    assert boundary == 2 and retry.overrides["trainer.resume_mode"] == "resume_path"
    view = sft_resume.make_resume_view(checkpoints, boundary, resume_view_root(run, ctx))
    assert retry.overrides["trainer.resume_from_path"] == view and not Path(view, sft_resume.LOADER_STATE).exists()
    _, guarded = probe(tmp_path / "guarded.json", probe_overrides(retry, checkpoints))
    assert guarded["steps_per_epoch"] == plan.steps_per_epoch
    assert guarded["loaded"] == [view] and guarded["resumed_from"] == 2
    assert [s["step"] for s in guarded["trained"]] == [3, 4, 5, 6]
    assert [s["indices"] for s in guarded["trained"]] == uninterrupted[2:], "exactly the batches the uninterrupted run trains after step 2"
    assert completion.unmet(completion.expectation(run, "sft", plan)) is None
    assert Path(checkpoints, "global_step_2", sft_resume.LOADER_STATE).exists(), "the checkpoint itself is left as verl wrote it"


def test_mid_epoch_checkpoints_resume_with_their_loader_state(tmp_path: Path) -> None:
    run = small_run(tmp_path, saveFreq=1)
    step3 = Path(run_paths(run).sft_checkpoints, "global_step_3")
    step3.mkdir(parents=True)
    torch.save({}, step3 / sft_resume.LOADER_STATE)
    (step3 / "model_world_size_1_rank_0.pt").write_bytes(b"x")
    Path(run_paths(run).sft_checkpoints, "latest_checkpointed_iteration.txt").write_text("3")
    command, _, boundary = resolve_sft(run, context_of(run), render_stage(run, "sft", context_of(run)))
    assert boundary is None and command.overrides["trainer.resume_mode"] == "auto" and "trainer.resume_from_path" not in command.overrides
