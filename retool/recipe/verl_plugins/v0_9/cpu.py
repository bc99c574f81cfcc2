"""verl 0.9.1 on CPU (``hardware.accelerator: cpu``): what every process of a CPU run loads first.

The renderer puts this module in ``VERL_USE_EXTERNAL_MODULES`` (with ``VERL_PLATFORM=cpu``), which
verl imports inside its own ``import verl`` (``verl/__init__.py``, 0.9.1), so it is in place in the
torchrun ranks, the Ray driver and every Ray worker before verl's workers are imported. It

- registers the ``cpu`` platform (:mod:`.cpu_platform`);
- gives verl's process groups the backend ``gloo``: ``verl/utils/distributed.py`` (0.9.1) builds
  ``cpu:gloo,{device}:{backend}``, which for the device ``cpu`` names ``cpu`` twice, and torch
  refuses that string (``Duplicate device type cpu``). Both initialisers are rebound here, before
  ``verl.workers.engine_workers`` binds them by name;
- registers the rehearsal rollout engine ``hf`` (:mod:`.hf_rollout`) in verl's two registries.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import verl.utils.distributed as verl_distributed

from retool.recipe.verl_plugins.v0_9 import cpu_platform  # noqa: F401  (registers the platform)

BACKEND = "gloo"


def _on_gloo(initialise: Any) -> Any:
    @functools.wraps(initialise)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if "backend" in inspect.signature(initialise).parameters:
            kwargs["backend"] = BACKEND
            return initialise(*args, **kwargs)
        import torch.distributed

        original = torch.distributed.init_process_group

        def init(*a: Any, **kw: Any) -> Any:
            kw["backend"] = BACKEND
            return original(*a, **kw)

        torch.distributed.init_process_group = init
        try:
            return initialise(*args, **kwargs)
        finally:
            torch.distributed.init_process_group = original

    wrapper.__retool_gloo__ = True  # type: ignore[attr-defined]
    return wrapper


if not getattr(verl_distributed.initialize_global_process_group, "__retool_gloo__", False):
    verl_distributed.initialize_global_process_group = _on_gloo(verl_distributed.initialize_global_process_group)
    verl_distributed.initialize_global_process_group_ray = _on_gloo(verl_distributed.initialize_global_process_group_ray)


def _register_engines() -> None:
    """verl's FSDP engines, registered for the device ``cpu`` too (0.9.1 registers them for cuda and npu only)."""
    # Imported here, after the platform is registered: importing the engines asks verl for the platform.
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead, FSDPEngineWithValueHead

    for model_type, engine in (("language_model", FSDPEngineWithLMHead), ("value_model", FSDPEngineWithValueHead)):
        registered = EngineRegistry._engines.get(model_type, {})
        if all("cpu" in registered.get(backend, {}) for backend in ("fsdp", "fsdp2")):
            continue
        EngineRegistry.register(model_type=model_type, backend=["fsdp", "fsdp2"], device=["cpu"])(engine)


_register_engines()


def _load_hf_replica() -> type:
    from retool.recipe.verl_plugins.v0_9.hf_rollout import HFReplica

    return HFReplica


def _register_rollout() -> None:
    """``hf`` in verl's replica registry (built by the trainer) and its in-worker registry (``BaseRollout``)."""
    from verl.workers.rollout.base import _ROLLOUT_REGISTRY
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    from retool.recipe.verl_plugins.v0_9 import HF_ROLLOUT_ADAPTER, HF_ROLLOUT_ENGINE

    RolloutReplicaRegistry.register(HF_ROLLOUT_ENGINE, _load_hf_replica)
    _ROLLOUT_REGISTRY[(HF_ROLLOUT_ENGINE, "async")] = HF_ROLLOUT_ADAPTER


_register_rollout()
