"""Where each stage reads and writes on the run's PVC.

Stages run in different pods (and after retries or operator restarts), so they find each
other's outputs by convention alone: every path is a pure function of the run. The operator
mounts the claim at ``storage.pvc.mountPath`` in every stage pod.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from retool.spec.model import RetoolRun


@dataclass(frozen=True)
class RunPaths:
    root: str

    @property
    def data(self) -> str:
        return posixpath.join(self.root, "data")

    @property
    def sft_train(self) -> str:
        return posixpath.join(self.data, "sft", "train.parquet")

    @property
    def rl_train(self) -> str:
        return posixpath.join(self.data, "rl", "train.parquet")

    def eval_set(self, name: str) -> str:
        return posixpath.join(self.data, "eval", f"{name}.parquet")

    @property
    def base_model(self) -> str:
        """The base model staged by the prepare stage (a hub or s3:// model; a PVC path is used in place)."""
        return posixpath.join(self.root, "models", "base")

    @property
    def cache(self) -> str:
        """Caches that outlive a pod: the Hugging Face cache and the compile caches (vLLM, inductor, triton)."""
        return posixpath.join(self.root, "cache")

    @property
    def sft_checkpoints(self) -> str:
        return posixpath.join(self.root, "checkpoints", "sft")

    @property
    def sft_merged(self) -> str:
        """The SFT model in Hugging Face format: the merge stage's output, the RL stage's input."""
        return posixpath.join(self.root, "models", "sft")

    @property
    def rl_checkpoints(self) -> str:
        return posixpath.join(self.root, "checkpoints", "rl")

    @property
    def rl_merged(self) -> str:
        """The final model in Hugging Face format, evaluated and registered."""
        return posixpath.join(self.root, "models", "rl")

    @property
    def eval_output(self) -> str:
        return posixpath.join(self.root, "eval")

    @property
    def stage_files(self) -> str:
        """Rendered per-stage files (tool config, commands) kept for inspection."""
        return posixpath.join(self.root, "stages")


CACHE_ENV_DIRS = {
    "HF_HOME": "huggingface",
    "VLLM_CACHE_ROOT": "vllm",
    "TORCHINDUCTOR_CACHE_DIR": "torchinductor",
    "TRITON_CACHE_DIR": "triton",
}
"""Cache variables and their directory under ``RunPaths.cache``: without them each pod (and each
retry) writes these caches into its container layer and recompiles from nothing."""


def cache_env(paths: RunPaths) -> dict[str, str]:
    """Environment that puts the Hugging Face and compile caches on the run's PVC (one definition for renderer and operator)."""
    return {name: posixpath.join(paths.cache, sub) for name, sub in CACHE_ENV_DIRS.items()}


def staged_model_path(run: RetoolRun) -> str:
    """Where every stage after prepare reads the base model: a PVC path as given, else the staged copy."""
    base = run.spec.model.base
    return base if base.startswith("/") else run_paths(run).base_model


def run_paths(run: RetoolRun) -> RunPaths:
    """``<mountPath>/<subPath>/<namespace>/<name>``: runs sharing a claim never collide."""
    pvc = run.spec.storage.pvc
    if pvc is None:
        raise ValueError("spec.storage.pvc is required")
    namespace = run.metadata.namespace or "default"
    parts = [pvc.mount_path] + ([pvc.sub_path] if pvc.sub_path else []) + [namespace, run.metadata.name]
    return RunPaths(root=posixpath.join(*parts))
