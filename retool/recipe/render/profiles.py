"""Engine settings the RetoolRun spec does not expose, keyed by model size and accelerator.

The spec carries the knobs a researcher tunes (batch sizes, lengths, tensor/sequence parallel,
offload). What remains - how many tokens the rollout engine batches, how long a micro-batch may be
in tokens, whether the SFT trainer offloads - depends on how large the model is against the
device memory, so it is chosen here from the public references: Qwen2.5-32B on 8x H200 (verl
``recipe/retool/run_qwen2-32b_*.sh``) and Qwen2.5-7B on 8x Ascend 910 (the Ascend ReTool best
practice). Other sizes are interpolated conservatively: bigger models get smaller token budgets.

Why spec fields are never overridden by a profile: the CRD gives every spec field a default and
the API server fills it in, so on the cluster a stage cannot tell a default from a user's choice.
Profiles therefore only *advise* on those (``advice``), which ``retool render`` prints.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from retool.spec.model import RetoolRunSpec

_SIZE_IN_NAME = re.compile(r"(?<![A-Za-z0-9.])(\d+(?:\.\d+)?)\s*[Bb](?![A-Za-z])")


def model_size_billions(spec: RetoolRunSpec) -> float | None:
    """``model.sizeBillions``, else the size in the model name (``Qwen2.5-32B-Instruct`` -> 32)."""
    if spec.model.size_billions is not None:
        return spec.model.size_billions
    name = spec.model.base.rstrip("/").rsplit("/", 1)[-1]
    matches = _SIZE_IN_NAME.findall(name)
    return float(matches[-1]) if matches else None


@dataclass(frozen=True)
class EngineProfile:
    """Settings for one (model size class, accelerator) pair."""

    name: str
    # RL / eval (verl main_ppo)
    actor_token_factor: int
    """ppo_max_token_len_per_gpu = (prompt + response) x this (dynamic batch sizing)."""
    log_prob_token_factor: int
    """Reference / rollout log-prob token budget = actor budget x this (forward only)."""
    rollout_max_num_seqs: int
    enforce_eager: bool
    ref_param_offload: bool
    agent_workers: int
    # SFT (verl fsdp_sft_trainer)
    sft_strategy: str
    sft_cpu_offload: bool
    # what the public reference uses for the spec fields (advice only, see module docstring)
    recommended_tensor_parallel: int
    recommended_sequence_parallel: int
    recommended_sft_sequence_parallel: int


# Size classes: the smallest class whose bound is >= the model size.
_SIZE_CLASSES: tuple[tuple[float, str], ...] = ((3.0, "small"), (14.0, "medium"), (40.0, "large"), (float("inf"), "huge"))

def _profile(name: str, *, tp: int, sp: int, sft_sp: int, **engine: object) -> EngineProfile:
    defaults: dict[str, object] = {
        "actor_token_factor": 1,
        "log_prob_token_factor": 4,
        "rollout_max_num_seqs": 1024,
        "enforce_eager": False,
        "ref_param_offload": True,
        "agent_workers": 8,
        "sft_strategy": "fsdp2",
        "sft_cpu_offload": False,
    }
    defaults.update(engine)
    return EngineProfile(
        name=name, recommended_tensor_parallel=tp, recommended_sequence_parallel=sp, recommended_sft_sequence_parallel=sft_sp, **defaults  # type: ignore[arg-type]
    )


_PROFILES: dict[tuple[str, str], EngineProfile] = {
    ("small", "nvidia"): _profile("small-nvidia", tp=1, sp=1, sft_sp=1, actor_token_factor=2, ref_param_offload=False),
    ("medium", "nvidia"): _profile("medium-nvidia", tp=2, sp=4, sft_sp=4),
    # Qwen2.5-32B on 8x H200: the paper's setting (run_qwen2-32b_dapo.sh / run_qwen2-32b_sft.sh).
    ("large", "nvidia"): _profile("large-nvidia", tp=4, sp=8, sft_sp=4, sft_strategy="fsdp"),
    ("huge", "nvidia"): _profile("huge-nvidia", tp=8, sp=8, sft_sp=8, log_prob_token_factor=2, rollout_max_num_seqs=512, sft_strategy="fsdp", sft_cpu_offload=True),
    # Ascend SFT uses FSDP1 (strategy fsdp): what the public Ascend SFT scripts run and what verl's
    # Ascend support table lists for fsdp_sft_trainer; fsdp2 is not known to work there.
    ("small", "ascend"): _profile("small-ascend", tp=1, sp=2, sft_sp=2, ref_param_offload=False, sft_strategy="fsdp"),
    # Qwen2.5-7B on 8x Ascend 910 (Atlas 900 A2): the Ascend ReTool best practice.
    ("medium", "ascend"): _profile("medium-ascend", tp=2, sp=4, sft_sp=4, sft_strategy="fsdp"),
    ("large", "ascend"): _profile("large-ascend", tp=8, sp=8, sft_sp=8, log_prob_token_factor=2, rollout_max_num_seqs=512, sft_strategy="fsdp", sft_cpu_offload=True),
    ("huge", "ascend"): _profile(
        "huge-ascend", tp=8, sp=16, sft_sp=16, log_prob_token_factor=2, rollout_max_num_seqs=256, sft_strategy="fsdp", sft_cpu_offload=True
    ),
}

# A CPU rehearsal (hardware.accelerator cpu, docs/rehearsal.md) runs tiny models whatever their class:
# one agent-loop worker (each is a process importing verl), no offload, one device slot per process.
_CPU = _profile("rehearsal-cpu", tp=1, sp=1, sft_sp=1, agent_workers=1, rollout_max_num_seqs=64, enforce_eager=True, ref_param_offload=False)
_PROFILES.update({(size, "cpu"): _CPU for _bound, size in _SIZE_CLASSES})

DEFAULT_SIZE_CLASS = "large"
"""Used when the size is neither given nor in the model name: the spec's defaults are the 32B recipe."""


def size_class(size_billions: float | None) -> str:
    if size_billions is None:
        return DEFAULT_SIZE_CLASS
    return next(name for bound, name in _SIZE_CLASSES if size_billions <= bound)


def engine_profile(spec: RetoolRunSpec) -> EngineProfile:
    return _PROFILES[(size_class(model_size_billions(spec)), spec.hardware.accelerator)]


def advice(spec: RetoolRunSpec) -> list[str]:
    """Where the spec's parallelism departs from what the profile's public reference uses.

    Departures can be deliberate, so these are notes for a person, never errors; sizes that
    would not divide this run's devices are not suggested.
    """
    profile = engine_profile(spec)
    devices = spec.hardware.nodes * spec.hardware.devices_per_node
    per_node = spec.hardware.devices_per_node
    notes = []
    pairs = (
        ("rl.tensorParallel", spec.rl.tensor_parallel, profile.recommended_tensor_parallel, per_node),
        ("rl.sequenceParallel", spec.rl.sequence_parallel, profile.recommended_sequence_parallel, devices),
    )
    if spec.sft.enabled:
        pairs += (("sft.sequenceParallel", spec.sft.sequence_parallel, profile.recommended_sft_sequence_parallel, devices),)
    for path, actual, recommended, divides in pairs:
        if actual != recommended and recommended <= divides and divides % recommended == 0:
            notes.append(f"spec.{path} is {actual}; the {profile.name} profile (model size {model_size_billions(spec) or 'unknown'}B) uses {recommended}")
    return notes
