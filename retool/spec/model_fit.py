"""Does the run fit the model? The spec against the model's ``config.json`` (and its tokenizer's size).

Runs that cannot work on accelerators pass every spec-only rule: the model decides the rest. Each
rule here is what a framework asserts or refuses at start-up, minutes into a stage that already
holds every device, written as a message naming the spec field to change and the numbers:

- context window: vLLM refuses a ``max_model_len`` above the length it derives from the model's
  config (``max_position_embeddings``, times the RoPE scaling factor when the config has one);
  verl's rollout uses ``max_model_len = rl.maxPromptLength + rl.maxResponseLength``.
- heads: vLLM splits attention heads over tensor-parallel ranks (``num_attention_heads`` must be a
  multiple of ``rl.tensorParallel``; KV heads a multiple of it, or it a multiple of them, when they
  are replicated); verl's Ulysses patch asserts ``num_attention_heads % sp == 0`` and ``kv_heads
  % sp == 0 or sp % kv_heads == 0`` (verl 0.6.1 ``verl/models/transformers/monkey_patch.py``).
- vocabulary: a tokenizer with more tokens than the embedding has rows produces ids the model
  cannot look up.
- memory: the rollout engine holds its weights (parameters x bytes / tensor parallel), its profiling
  activations and its memory outside PyTorch in ``gpuMemoryUtilization`` of a device; what is left
  is KV cache, and vLLM refuses to start when it cannot hold one sequence of ``max_model_len``
  tokens. Training memory, phase by phase (rollout beside what the trainer keeps on the device,
  the actor update, log-probabilities), is :mod:`retool.spec.memory_fit`; a phase over the device
  is refused with its arithmetic.

Pure: the caller reads config.json (``retool validate --model-config``, the preflight's ``model``
check); the admission webhook has no model and checks only the spec-only rules.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from retool.spec.memory_fit import VLLM_NON_TORCH_GIB, MemoryPlan, Shape, memory_plan
from retool.spec.model import RetoolRunSpec

Severity = Literal["error", "warning"]
GIB = 2**30

DEVICE_MEMORY_GIB: dict[str, float] = {
    # total memory per device as the driver reports it (nvidia-smi's MiB / 1024)
    "NVIDIA-B200": 179.1,
    "NVIDIA-H200": 140.4,
    "NVIDIA-H200-NVL": 140.4,
    "NVIDIA-H100-80GB-HBM3": 79.6,
    "NVIDIA-H100-PCIe": 79.6,
    "NVIDIA-H100-NVL": 93.6,
    "NVIDIA-H800": 79.6,
    "NVIDIA-H20": 95.6,
    "NVIDIA-A100-SXM4-80GB": 80.0,
    "NVIDIA-A100-80GB-PCIe": 80.0,
    "NVIDIA-A100-SXM4-40GB": 40.0,
    "NVIDIA-A100-PCIE-40GB": 40.0,
    "NVIDIA-A800-SXM4-80GB": 80.0,
    "NVIDIA-L40S": 45.0,
    "NVIDIA-L40": 45.0,
    "NVIDIA-L4": 22.5,
}
ASCEND_MEMORY_GIB = 64.0
"""Ascend 910B (Atlas A2) and 910C dies (Atlas A3): 64 GB HBM per device."""
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float": 4, "half": 2}
NO_LENGTH_FACTOR = {"su", "longrope", "llama3", "mrope", "default"}
"""RoPE types whose ``factor`` does not extend the context window (vLLM reads their length elsewhere)."""


@dataclass(frozen=True)
class Finding:
    severity: Severity
    path: str
    """The spec field to change (``spec.rl.tensorParallel``)."""
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


@dataclass(frozen=True)
class ModelShape:
    """What the rules need from config.json."""

    context_window: int | None
    window_source: str
    attention_heads: int | None
    kv_heads: int | None
    hidden_size: int | None
    layers: int | None
    intermediate_size: int | None
    vocab_size: int | None
    head_dim: int | None
    tied_embeddings: bool
    dtype_bytes: int

    @property
    def parameters(self) -> int | None:
        """Parameters of a decoder-only transformer with gated MLP (Llama/Qwen/Mistral layout), biases aside."""
        if None in (self.hidden_size, self.layers, self.intermediate_size, self.vocab_size, self.attention_heads, self.kv_heads, self.head_dim):
            return None
        h, kv = self.hidden_size, self.kv_heads * self.head_dim  # type: ignore[operator]
        q = self.attention_heads * self.head_dim  # type: ignore[operator]
        per_layer = h * q + 2 * h * kv + q * h + 3 * h * self.intermediate_size + 2 * h  # type: ignore[operator]
        embeddings = self.vocab_size * h * (1 if self.tied_embeddings else 2)  # type: ignore[operator]
        return per_layer * self.layers + embeddings + h  # type: ignore[operator]


def _text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    for key in ("text_config", "llm_config"):
        nested = config.get(key)
        if isinstance(nested, Mapping) and "num_attention_heads" in nested:
            return nested
    return config


def model_shape(config: Mapping[str, Any]) -> ModelShape:
    c = _text_config(config)
    window, source = c.get("max_position_embeddings"), "max_position_embeddings"
    scaling = c.get("rope_scaling") or {}
    rope_type = str(scaling.get("rope_type") or scaling.get("type") or "")
    if window and scaling.get("factor") and rope_type not in NO_LENGTH_FACTOR:
        base = scaling.get("original_max_position_embeddings") if rope_type == "yarn" and scaling.get("original_max_position_embeddings") else window
        window, source = int(base * float(scaling["factor"])), f"{source} with {rope_type} RoPE scaling x{scaling['factor']}"
    heads = c.get("num_attention_heads")
    hidden = c.get("hidden_size")
    head_dim = c.get("head_dim") or (hidden // heads if hidden and heads else None)
    dtype = str(c.get("torch_dtype") or c.get("dtype") or config.get("torch_dtype") or "bfloat16")
    return ModelShape(
        context_window=int(window) if window else None,
        window_source=source,
        attention_heads=heads,
        kv_heads=c.get("num_key_value_heads") or heads,
        hidden_size=hidden,
        layers=c.get("num_hidden_layers"),
        intermediate_size=c.get("intermediate_size"),
        vocab_size=c.get("vocab_size"),
        head_dim=head_dim,
        tied_embeddings=bool(c.get("tie_word_embeddings", config.get("tie_word_embeddings", False))),
        dtype_bytes=DTYPE_BYTES.get(dtype, 2),
    )


def device_memory_gib(spec: RetoolRunSpec) -> float | None:
    """Memory of one device of the run's hardware, or None when the spec does not say which device."""
    if spec.hardware.accelerator == "ascend":
        return ASCEND_MEMORY_GIB
    return DEVICE_MEMORY_GIB.get(spec.hardware.product or "")


def _context(spec: RetoolRunSpec, shape: ModelShape) -> list[Finding]:
    out: list[Finding] = []
    window = shape.context_window
    if window is None:
        return out
    rl = spec.rl
    total = rl.max_prompt_length + rl.max_response_length
    if (rl.enabled or spec.eval.enabled) and total > window:
        out.append(
            Finding(
                "error",
                "spec.rl.maxResponseLength",
                f"maxPromptLength + maxResponseLength = {rl.max_prompt_length} + {rl.max_response_length} = {total} tokens exceeds the model's context window "
                f"of {window} ({shape.window_source} in config.json): vLLM refuses max_model_len {total}; lower them to a sum of at most {window}",
            )
        )
    if spec.sft.enabled and spec.sft.max_length > window:
        out.append(
            Finding(
                "warning",
                "spec.sft.maxLength",
                f"{spec.sft.max_length} tokens is longer than the model's context window of {window} ({shape.window_source}): positions beyond it were never trained",
            )
        )
    return out


def _divisible(path: str, size: int, heads: int | None, what: str, who: str, *, replicate: bool) -> Finding | None:
    if heads is None or size <= 1 or heads % size == 0 or (replicate and size % heads == 0):
        return None
    rule = f"a multiple of it{' or a divisor of it' if replicate else ''}"
    return Finding("error", path, f"{size} does not split the model's {heads} {what} (config.json): {who} needs the head count to be {rule}")


def _heads(spec: RetoolRunSpec, shape: ModelShape) -> list[Finding]:
    rl, sft = spec.rl, spec.sft
    checks = []
    if rl.enabled or spec.eval.enabled:
        checks += [
            _divisible("spec.rl.tensorParallel", rl.tensor_parallel, shape.attention_heads, "attention heads", "vLLM's tensor parallelism", replicate=False),
            _divisible("spec.rl.tensorParallel", rl.tensor_parallel, shape.kv_heads, "key/value heads", "vLLM's tensor parallelism", replicate=True),
        ]
    if rl.enabled:
        checks += [
            _divisible("spec.rl.sequenceParallel", rl.sequence_parallel, shape.attention_heads, "attention heads", "verl's Ulysses sequence parallelism", replicate=False),
            _divisible("spec.rl.sequenceParallel", rl.sequence_parallel, shape.kv_heads, "key/value heads", "verl's Ulysses sequence parallelism", replicate=True),
        ]
    if sft.enabled:
        checks += [
            _divisible("spec.sft.sequenceParallel", sft.sequence_parallel, shape.attention_heads, "attention heads", "verl's Ulysses sequence parallelism", replicate=False),
            _divisible("spec.sft.sequenceParallel", sft.sequence_parallel, shape.kv_heads, "key/value heads", "verl's Ulysses sequence parallelism", replicate=True),
        ]
    seen: set[tuple[str, str]] = set()
    out = []
    for finding in checks:
        if finding is not None and (finding.path, finding.message) not in seen:
            seen.add((finding.path, finding.message))
            out.append(finding)
    return out


def memory_shape(shape: ModelShape) -> Shape | None:
    """The shape the memory estimate needs, or None when config.json leaves part of it out."""
    params = shape.parameters
    if params is None or None in (shape.layers, shape.hidden_size, shape.intermediate_size, shape.vocab_size, shape.kv_heads, shape.head_dim):
        return None
    return Shape(
        parameters=params,
        layers=shape.layers,  # type: ignore[arg-type]
        hidden_size=shape.hidden_size,  # type: ignore[arg-type]
        intermediate_size=shape.intermediate_size,  # type: ignore[arg-type]
        vocab_size=shape.vocab_size,  # type: ignore[arg-type]
        kv_heads=shape.kv_heads,  # type: ignore[arg-type]
        head_dim=shape.head_dim,  # type: ignore[arg-type]
        dtype_bytes=shape.dtype_bytes,
    )


def training_memory(spec: RetoolRunSpec, shape: ModelShape) -> MemoryPlan | None:
    """Every phase's memory on one device (:mod:`retool.spec.memory_fit`), or None when the device or the shape is unknown."""
    memory, fit_shape = device_memory_gib(spec), memory_shape(shape)
    if memory is None or fit_shape is None:
        return None
    return memory_plan(spec, fit_shape, memory)


def rollout_memory(spec: RetoolRunSpec, shape: ModelShape) -> dict[str, float] | None:
    """The memory arithmetic on one device (GiB): the rollout engine's, and each phase's total; None when something is unknown."""
    plan = training_memory(spec, shape)
    if plan is None:
        return None
    out = {
        "device_gib": plan.rollout.device_gib,
        "budget_gib": plan.budget_gib,
        "weights_gib": plan.weights_gib,
        "vllm_activation_gib": plan.vllm_activation_gib,
        "kv_cache_gib": plan.kv_cache_gib,
        "sequence_kv_gib": plan.sequence_kv_gib,
        "parameters_billions": shape.parameters / 1e9,  # type: ignore[operator]
        "rollout_phase_gib": plan.rollout.total_gib,
    }
    if spec.rl.enabled:
        out["update_phase_gib"] = plan.update.total_gib
        out["log_prob_phase_gib"] = plan.log_prob.total_gib
    return out


def _memory(spec: RetoolRunSpec, shape: ModelShape) -> list[Finding]:
    if not (spec.rl.enabled or spec.eval.enabled):
        return []
    plan = training_memory(spec, shape)
    if plan is None:
        return []
    rl = spec.rl
    tokens = rl.max_prompt_length + rl.max_response_length
    device = spec.hardware.product or spec.hardware.accelerator
    out: list[Finding] = []
    if plan.kv_cache_gib < plan.sequence_kv_gib:
        out.append(
            Finding(
                "error",
                "spec.rl.tensorParallel",
                f"the rollout engine does not fit one device: {plan.rollout.device_gib:.1f} GiB ({device}) "
                f"x gpuMemoryUtilization {rl.gpu_memory_utilization} = {plan.budget_gib:.1f} GiB, "
                f"minus the weights {shape.parameters / 1e9:.1f}B parameters x {shape.dtype_bytes} bytes / tensorParallel {rl.tensor_parallel} = {plan.weights_gib:.1f} GiB, "  # type: ignore[operator]
                f"vLLM's profiling activations {plan.vllm_activation_gib:.1f} GiB and its memory outside PyTorch {VLLM_NON_TORCH_GIB} GiB, "
                f"leaves {plan.kv_cache_gib:.1f} GiB of KV cache, less than the {plan.sequence_kv_gib:.2f} GiB one sequence of {tokens} tokens needs: vLLM refuses to start "
                "(raise rl.tensorParallel or rl.gpuMemoryUtilization, or shorten maxPromptLength + maxResponseLength)",
            )
        )
    if not plan.rollout.fits:
        keeps_actor = rl.enabled and not rl.offload
        out.append(
            Finding(
                "error",
                "spec.rl.offload" if keeps_actor else "spec.rl.gpuMemoryUtilization",
                f"the rollout phase does not fit one device ({device}): {plan.rollout.arithmetic()}: "
                + ("set rl.offload: true (the actor's state then waits in host memory) or lower rl.gpuMemoryUtilization" if keeps_actor else "lower rl.gpuMemoryUtilization"),
            )
        )
    if rl.enabled and not plan.update.fits:
        out.append(
            Finding(
                "error",
                "spec.hardware.nodes",
                f"the actor update does not fit one device ({device}; verl loads parameters and optimizer back whatever the offload): {plan.update.arithmetic()}: "
                "add nodes or devices (the actor's 16 bytes per parameter are sharded over all of them), or shorten maxPromptLength + maxResponseLength",
            )
        )
    if rl.enabled and not plan.log_prob.fits:
        out.append(
            Finding(
                "error",
                "spec.rl.maxResponseLength",
                f"computing log-probabilities does not fit one device ({device}): {plan.log_prob.arithmetic()}: "
                "shorten maxPromptLength + maxResponseLength, " + ("" if rl.offload else "set rl.offload: true, ") + "or add nodes or devices",
            )
        )
    return out


def _vocabulary(shape: ModelShape, tokenizer_size: int | None) -> list[Finding]:
    if tokenizer_size is None or shape.vocab_size is None or tokenizer_size <= shape.vocab_size:
        return []
    return [
        Finding(
            "error",
            "spec.model.base",
            f"the tokenizer has {tokenizer_size} tokens but the model's embedding has {shape.vocab_size} rows (config.json vocab_size): "
            "ids above it cannot be looked up; use the tokenizer that belongs to the model",
        )
    ]


def model_fit_findings(spec: RetoolRunSpec, config: Mapping[str, Any], *, tokenizer_size: int | None = None) -> list[Finding]:
    """Every way ``spec`` does not fit the model described by ``config`` (a parsed config.json)."""
    shape = model_shape(config)
    return [*_context(spec, shape), *_heads(spec, shape), *_memory(spec, shape), *_vocabulary(shape, tokenizer_size)]


def read_model_config(path: str | Path) -> dict[str, Any]:
    """config.json from a model directory or the file itself; ValueError naming the path otherwise."""
    p = Path(path)
    file = p / "config.json" if p.is_dir() else p
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{file} does not exist: give a model directory holding config.json, or the file") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{file} is not JSON: {err}") from None
