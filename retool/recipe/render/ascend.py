"""What verl 0.6.1 needs on Huawei Ascend NPUs, after the public Ascend ReTool best practice.

Two parts: the process environment (vLLM-Ascend and CANN switches) and Hydra overrides (device
name, entropy computation in chunks with recomputation so that the full-vocabulary logits of
20k-token responses fit, and no torch.compile, which torch_npu does not support for these
kernels). Kept apart from the renderers so that the whole Ascend difference reads in one place.
"""

from __future__ import annotations

from typing import Any

ASCEND_ENV: dict[str, str] = {
    # vLLM-Ascend 0.11 runs on the V1 engine only.
    "VLLM_USE_V1": "1",
    # Dynamo tracing breaks on torch_npu ops; verl's torch.compile paths are also off (overrides).
    "TORCHDYNAMO_DISABLE": "1",
    # FRACTAL_NZ weight layout corrupts weights synced from FSDP into vLLM-Ascend 0.11.
    "VLLM_ASCEND_ENABLE_NZ": "0",
    # Asynchronous operator dispatch (CANN task queue).
    "TASK_QUEUE_ENABLE": "1",
    "VLLM_ENABLE_GRAPH_MODE": "1",
    # HCCL collectives expanded on the AI vector cores: faster weight sync between trainer and rollout.
    "HCCL_OP_EXPANSION_MODE": "AIV",
    "VLLM_ASCEND_ENABLE_MLP_OPTIMIZE": "1",
}
"""Environment of every Ascend trainer process (the recipe also preloads jemalloc: the Ascend
trainer image installs libjemalloc2 and sets LD_PRELOAD in its own environment, where the
library's path for the image's architecture is known)."""

DEVICE = {"nvidia": "cuda", "ascend": "npu", "cpu": "cpu"}
"""verl's ``trainer.device`` per accelerator."""

RAY_DEVICE_RESOURCE = {"nvidia": "GPU", "ascend": "NPU", "cpu": "GPU"}
"""The Ray resource a device is declared as (the operator declares NPU in rayStartParams; a CPU rehearsal's
training slots are declared as GPUs, see retool.recipe.verl_plugins.v0_9.cpu_platform)."""


def ppo_overrides() -> dict[str, Any]:
    """main_ppo overrides for Ascend (actor and reference)."""
    overrides: dict[str, Any] = {"trainer.device": "npu"}
    for role in ("actor", "ref"):
        overrides[f"actor_rollout_ref.{role}.entropy_from_logits_with_chunking"] = True
        overrides[f"actor_rollout_ref.{role}.entropy_checkpointing"] = True
        overrides[f"actor_rollout_ref.{role}.use_torch_compile"] = False
    return overrides


SFT_STRATEGY = "fsdp"
"""FSDP1: what the public Ascend SFT scripts run and verl's Ascend support table lists for the SFT
trainer (fsdp2 is not known to work on torch_npu 2.7.1 there)."""


def sft_overrides() -> dict[str, Any]:
    """fsdp_sft_trainer overrides for Ascend."""
    return {"trainer.device": "npu", "model.strategy": SFT_STRATEGY}
