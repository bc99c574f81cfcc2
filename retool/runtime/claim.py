"""What a run writes to its claim, and so how large a claim the operator creates for it.

Pure functions of the spec, shared by the operator (which creates ``<run>-data``) and
``retool render`` (which shows the size before the run exists).

The default size of a created claim follows from what a run writes there, per parameter of the
model (bytes, with verl 0.6.1's FSDP checkpoints: fp32 parameters + AdamW's two fp32 moments):

=====================================  =========  ===============================================
what                                   bytes      why
=====================================  =========  ===============================================
base model staged once (bf16)          2          the Hugging Face weights every stage reads
SFT checkpoints                        2 x 12     ``max_ckpt_to_keep`` 2: params 4 + Adam 8
merged SFT model (bf16)                2          ``models/sft``, the RL starting point
RL actor checkpoints                   2 x 12     ``max_actor_ckpt_to_keep`` 2
RL critic checkpoints (ppo only)       2 x 12     ``max_critic_ckpt_to_keep`` 2
merged RL model (bf16, eval stage)     2          ``models/rl``
=====================================  =========  ===============================================

plus 20% and 20 GiB for the data, caches and logs, rounded up to two significant digits: the
32B GRPO recipe gets 2000Gi (54 bytes x 32e9 = 1.6 TiB before headroom), 7B 450Gi, 0.5B 51Gi.
"""

from __future__ import annotations

import math

from retool.recipe.render.common import MAX_CHECKPOINTS_KEPT
from retool.recipe.render.profiles import model_size_billions
from retool.spec.model import RetoolRun, RetoolRunSpec

CHECKPOINTS_KEPT = MAX_CHECKPOINTS_KEPT
"""SFT and RL checkpoints kept on the claim: the renderers' ``max_*ckpt_to_keep``."""
WEIGHT_BYTES = 2  # bf16 Hugging Face weights
CHECKPOINT_BYTES = 12  # fp32 parameters (4) + AdamW exp_avg and exp_avg_sq (8)
HEADROOM = 1.2
FIXED_GIB = 20
DEFAULT_SIZE_BILLIONS = 32.0
"""Assumed when the model size is neither given (model.sizeBillions) nor in its name: the 32B recipe."""
CLAIM_SUFFIX = "-data"


def bytes_per_parameter(spec: RetoolRunSpec) -> int:
    """What the run writes to its claim per model parameter (see the module docstring)."""
    total = WEIGHT_BYTES
    if spec.sft.enabled:
        total += CHECKPOINTS_KEPT * CHECKPOINT_BYTES + WEIGHT_BYTES
    if spec.rl.enabled:
        total += CHECKPOINTS_KEPT * CHECKPOINT_BYTES * (2 if spec.rl.algorithm == "ppo" else 1)
        if spec.eval.enabled:
            total += WEIGHT_BYTES
    return total


def _two_digits(gib: float) -> int:
    """Round up to two significant digits: 1951 -> 2000, 442 -> 450, 50.2 -> 51."""
    scale = 10 ** max(0, int(math.log10(gib)) - 1)
    return int(math.ceil(gib / scale) * scale)


def default_claim_size(spec: RetoolRunSpec) -> str:
    """The size of a created claim when ``storage.pvc.size`` is unset, e.g. ``2000Gi``."""
    billions = model_size_billions(spec) or DEFAULT_SIZE_BILLIONS
    gib = bytes_per_parameter(spec) * billions * 1e9 / 2**30
    return f"{_two_digits(gib * HEADROOM + FIXED_GIB)}Gi"


def claim_name(run: RetoolRun) -> str:
    """``storage.pvc.claimName``, else the ``<run>-data`` the operator creates."""
    pvc = run.spec.storage.pvc
    return pvc.claim_name if pvc.claim_name is not None else f"{run.metadata.name}{CLAIM_SUFFIX}"


def default_access_modes(spec: RetoolRunSpec) -> tuple[str, ...]:
    """ReadWriteMany when pods on several nodes mount the claim, else ReadWriteOnce (unless the spec says)."""
    if spec.storage.pvc.access_modes:
        return tuple(spec.storage.pvc.access_modes)
    return ("ReadWriteMany",) if spec.hardware.nodes > 1 else ("ReadWriteOnce",)
