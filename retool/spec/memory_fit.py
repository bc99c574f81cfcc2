"""Memory per device of an rl (or eval) stage, phase by phase, from the model's shape and the spec.

verl 0.6.1 runs the actor (FSDP) and the rollout engine (vLLM) on the same devices, one phase at a
time; each phase must fit one device. Estimates, in GiB per device, with N = nodes x devicesPerNode
and P the model's parameters (``ModelShape.parameters``):

Rollout (the engine generates; verl ``fsdp_workers.rollout_mode``):
  - vLLM takes ``gpuMemoryUtilization`` x device memory (vLLM ``gpu_worker``: it refuses to start when
    less is free, and sizes its KV cache inside it). Inside it: the weights (P x 2 bytes / tensorParallel),
    the activation peak of its profiling forward pass (``profile_run``: ``max_num_batched_tokens`` tokens
    through one layer, and the sampler's fp32 logits for ``max_num_seqs`` sequences), and memory outside
    PyTorch (NCCL, cuBLAS: ``VLLM_NON_TORCH_GIB``). What is left is KV cache, which must hold one
    sequence of maxPromptLength + maxResponseLength tokens.
  - Beside it: CUDA graphs (captured after the KV cache is sized, so outside the utilization share,
    ``VLLM_CUDA_GRAPH_GIB``; none with ``enforce_eager``), and what the trainer keeps on the device:
    with ``offload: false`` the actor's fp32 parameters, gradients and Adam moments stay
    (verl ``rollout_mode`` offloads parameters only when ``param_offload`` is set, the optimizer only
    when ``optimizer_offload`` is), 16 bytes x P / N; the reference model (bf16, 2 bytes x P / N)
    stays when KL is on and the profile does not offload it.
Actor update (verl ``update_actor`` loads parameters and optimizer back whatever the offload):
  - actor: fp32 parameters (4 bytes; verl builds the actor in fp32, ``model_dtype`` default), fp32
    gradients (4) and AdamW's two fp32 moments (8): 16 bytes x P / N, sharded by FSDP;
  - the reference model when KL is on and not offloaded (2 bytes x P / N);
  - activations of one micro-batch with gradient checkpointing (``ppo_max_token_len_per_gpu`` tokens
    T per device; Ulysses splits the packed sequence over the sequence-parallel ranks): the layer
    inputs kept at each checkpoint (layers x T x hidden x 2 bytes), one layer recomputed in the
    backward pass with its gradients (T x (6 x hidden + 4 x intermediate) x 2 bytes x 2), and the
    logits (T x vocabulary x 6 bytes: bf16 logits, their log-softmax and its gradient);
  - ``TRAINER_OVERHEAD_GIB`` outside PyTorch's tensors (CUDA context, NCCL), and vLLM's CUDA graphs,
    which sleeping does not free.
Log-probabilities (old policy and reference, forward only, ``log_prob_max_token_len_per_gpu``
tokens T' per device): the actor's fp32 parameters (all 16 bytes x P / N when not offloaded), the
reference model's bf16 parameters when KL is on, one layer's activations
(T' x (6 x hidden + 4 x intermediate) x 2 bytes), the logits (T' x vocabulary x 4 bytes: bf16
logits and one bf16 temporary; x 2 with entropy chunking, which the Ascend profile turns on), and
the same overhead.

These are estimates (a few GiB either way): a refusal means the phase is over the device by more
than that. docs/recipe.md ("Training memory: what fits where") has the table of models and devices
this model gives, next to what the public recipes run.
"""

from __future__ import annotations

from dataclasses import dataclass

from retool.spec.model import RetoolRunSpec

GIB = 2**30
ACTOR_BYTES_PER_PARAM = 16
"""fp32 parameters (4) + fp32 gradients (4) + AdamW first and second moments (4 + 4)."""
ACTOR_PARAM_BYTES = 4
REF_BYTES_PER_PARAM = 2
VLLM_NON_TORCH_GIB = 0.5
VLLM_CUDA_GRAPH_GIB = 1.0
TRAINER_OVERHEAD_GIB = 1.5
LOGIT_BYTES = 6
"""Actor update: bf16 logits, their log-softmax and its gradient."""
LOGIT_BYTES_FORWARD = 4
"""Log-probabilities (no gradient): bf16 logits and one bf16 temporary of the log-prob or entropy."""
LOGIT_BYTES_CHUNKED = 2
"""Log-probabilities with entropy chunking (the Ascend profile): the bf16 logits alone."""


@dataclass(frozen=True)
class Term:
    what: str
    arithmetic: str
    gib: float

    def __str__(self) -> str:
        return f"{self.what} {self.arithmetic} = {self.gib:.1f} GiB"


@dataclass(frozen=True)
class Phase:
    name: str
    terms: tuple[Term, ...]
    device_gib: float

    @property
    def total_gib(self) -> float:
        return sum(t.gib for t in self.terms)

    @property
    def fits(self) -> bool:
        return self.total_gib <= self.device_gib

    def arithmetic(self) -> str:
        return " + ".join(str(t) for t in self.terms) + f" = {self.total_gib:.1f} GiB of {self.device_gib:.1f} GiB"


@dataclass(frozen=True)
class Shape:
    """What the estimate needs from config.json (a subset of ``model_fit.ModelShape``)."""

    parameters: int
    layers: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int


@dataclass(frozen=True)
class MemoryPlan:
    rollout: Phase
    update: Phase
    log_prob: Phase
    kv_cache_gib: float
    sequence_kv_gib: float
    budget_gib: float
    weights_gib: float
    vllm_activation_gib: float

    @property
    def phases(self) -> tuple[Phase, ...]:
        return (self.rollout, self.update, self.log_prob)


def _gib(value: float) -> float:
    return value / GIB


def _layer_activation(tokens: int, shape: Shape) -> float:
    return tokens * (6 * shape.hidden_size + 4 * shape.intermediate_size) * 2


def update_activation_terms(tokens: int, shape: Shape) -> tuple[Term, ...]:
    """The actor update's activations for ``tokens`` tokens on one device (bench/gpu_training_memory.py measures them)."""
    layer = f"(6 x {shape.hidden_size} + 4 x {shape.intermediate_size}) x 2 B"
    return (
        Term("checkpointed layer inputs", f"{shape.layers} layers x {tokens} tokens x {shape.hidden_size} x 2 B", _gib(shape.layers * tokens * shape.hidden_size * 2)),
        Term("one recomputed layer with its gradients", f"{tokens} tokens x {layer} x 2", _gib(2 * _layer_activation(tokens, shape))),
        Term("logits", f"{tokens} tokens x {shape.vocab_size} x {LOGIT_BYTES} B", _gib(tokens * shape.vocab_size * LOGIT_BYTES)),
    )


def log_prob_activation_terms(tokens: int, shape: Shape, logit_bytes: int) -> tuple[Term, ...]:
    """The log-prob forward's activations for ``tokens`` tokens on one device (no gradient)."""
    layer = f"(6 x {shape.hidden_size} + 4 x {shape.intermediate_size}) x 2 B"
    return (
        Term("one layer's activations", f"{tokens} tokens x {layer}", _gib(_layer_activation(tokens, shape))),
        Term("logits", f"{tokens} tokens x {shape.vocab_size} x {logit_bytes} B", _gib(tokens * shape.vocab_size * logit_bytes)),
    )


def memory_plan(spec: RetoolRunSpec, shape: Shape, device_gib: float) -> MemoryPlan:
    """The three phases of an rl stage on one device of ``device_gib`` (see the module docstring)."""
    from retool.recipe.render.profiles import engine_profile  # pure; imported late: the renderer imports the spec

    rl, hw = spec.rl, spec.hardware
    profile = engine_profile(spec)
    devices = hw.nodes * hw.devices_per_node
    p, b = shape.parameters, f"{shape.parameters / 1e9:.1f}B params"
    sequence_tokens = rl.max_prompt_length + rl.max_response_length
    train_tokens = sequence_tokens * profile.actor_token_factor
    log_prob_tokens = train_tokens * profile.log_prob_token_factor
    kl = rl.enabled and (rl.use_kl_loss or rl.use_kl_in_reward)
    ref_resident = kl and not profile.ref_param_offload
    logit_bytes = LOGIT_BYTES_CHUNKED if hw.accelerator == "ascend" else LOGIT_BYTES_FORWARD

    tp = rl.tensor_parallel
    budget = device_gib * rl.gpu_memory_utilization
    weights = _gib(p * shape.dtype_bytes / tp)
    batched = sequence_tokens  # the renderer's max_num_batched_tokens
    vllm_activation = _gib(batched * (4 * shape.hidden_size + 2 * shape.intermediate_size // tp) * 2 + profile.rollout_max_num_seqs * shape.vocab_size * 4)
    kv_cache = budget - weights - vllm_activation - VLLM_NON_TORCH_GIB
    per_token = 2 * shape.layers * max(1, shape.kv_heads // tp) * shape.head_dim * shape.dtype_bytes

    actor = Term("actor (fp32 params, grads, Adam)", f"{ACTOR_BYTES_PER_PARAM} B x {b} / {devices} devices", _gib(ACTOR_BYTES_PER_PARAM * p / devices))
    ref = Term("reference model (bf16, KL on)", f"{REF_BYTES_PER_PARAM} B x {b} / {devices} devices", _gib(REF_BYTES_PER_PARAM * p / devices))
    graphs = Term("vLLM CUDA graphs", "(outside gpuMemoryUtilization)", 0.0 if profile.enforce_eager else VLLM_CUDA_GRAPH_GIB)
    overhead = Term("trainer overhead", "(CUDA context, NCCL)", TRAINER_OVERHEAD_GIB)

    rollout_terms = [Term("vLLM", f"gpuMemoryUtilization {rl.gpu_memory_utilization} x {device_gib:.1f} GiB", budget), graphs]
    if rl.enabled and not rl.offload:
        rollout_terms.append(Term("actor kept on the device (offload: false)", actor.arithmetic, actor.gib))
    if ref_resident:
        rollout_terms.append(ref)

    update_terms = [actor, *([ref] if ref_resident else []), *update_activation_terms(train_tokens, shape), overhead, graphs]

    params = Term("actor fp32 params", f"{ACTOR_PARAM_BYTES} B x {b} / {devices} devices", _gib(ACTOR_PARAM_BYTES * p / devices)) if rl.offload else actor
    log_prob_terms = [
        params,
        *([ref] if kl else []),
        *log_prob_activation_terms(log_prob_tokens, shape, logit_bytes),
        overhead,
        graphs,
    ]
    return MemoryPlan(
        rollout=Phase("rollout", tuple(t for t in rollout_terms if t.gib), device_gib),
        update=Phase("actor update", tuple(t for t in update_terms if t.gib), device_gib),
        log_prob=Phase("log-probabilities", tuple(t for t in log_prob_terms if t.gib), device_gib),
        kv_cache_gib=kv_cache,
        sequence_kv_gib=_gib(per_token * sequence_tokens),
        budget_gib=budget,
        weights_gib=weights,
        vllm_activation_gib=vllm_activation,
    )


# --- the table of docs/recipe.md ("Training memory: what fits where") ------------------------------

QWEN25_SHAPES: dict[str, dict[str, int]] = {
    # Qwen2.5-*-Instruct config.json values (hidden, layers, heads, KV heads, intermediate, vocabulary)
    "7B": {"hidden_size": 3584, "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4, "intermediate_size": 18944, "vocab_size": 152064},
    "32B": {"hidden_size": 5120, "num_hidden_layers": 64, "num_attention_heads": 40, "num_key_value_heads": 8, "intermediate_size": 27648, "vocab_size": 152064},
    "72B": {"hidden_size": 8192, "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8, "intermediate_size": 29568, "vocab_size": 152064},
}
TABLE_ROWS: tuple[tuple[str, str, int, int, bool], ...] = (
    # (model, product or "ascend", nodes, tensorParallel, offload); 8 devices a node, the 32B example otherwise
    ("7B", "ascend", 1, 2, True),
    ("7B", "NVIDIA-H100-80GB-HBM3", 1, 2, True),
    ("7B", "NVIDIA-H100-80GB-HBM3", 1, 2, False),
    ("32B", "NVIDIA-H200", 1, 4, True),
    ("32B", "NVIDIA-H200", 1, 4, False),
    ("32B", "NVIDIA-H100-80GB-HBM3", 1, 4, True),
    ("32B", "NVIDIA-H100-80GB-HBM3", 1, 4, False),
    ("32B", "NVIDIA-H100-80GB-HBM3", 2, 4, True),
    ("72B", "NVIDIA-A100-SXM4-80GB", 1, 8, True),
    ("72B", "NVIDIA-H100-80GB-HBM3", 1, 8, False),
    ("72B", "NVIDIA-H200", 1, 8, True),
    ("72B", "NVIDIA-H200", 2, 8, True),
    ("72B", "NVIDIA-H100-80GB-HBM3", 4, 8, True),
)


def fit_table() -> str:
    """The Markdown table of TABLE_ROWS: each phase's GiB per device and the verdict (the 32B example's lengths and batch)."""
    from retool.spec.model_fit import ASCEND_MEMORY_GIB, DEVICE_MEMORY_GIB, model_fit_findings, model_shape, training_memory  # model_fit imports this module

    lines = [
        "| model | devices | offload | rollout | actor update | log-probs | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for model, product, nodes, tp, offload in TABLE_ROWS:
        config = {**QWEN25_SHAPES[model], "tie_word_embeddings": False, "max_position_embeddings": 32768, "torch_dtype": "bfloat16"}
        hardware: dict[str, object] = {"accelerator": "ascend"} if product == "ascend" else {"accelerator": "nvidia", "product": product}
        spec = RetoolRunSpec.model_validate(
            {"model": {"base": f"Qwen/Qwen2.5-{model}-Instruct"}, "hardware": {**hardware, "nodes": nodes, "devicesPerNode": 8},
             "rl": {"tensorParallel": tp, "sequenceParallel": 4 if model == "7B" else 8, "offload": offload}}
        )  # fmt: skip
        plan = training_memory(spec, model_shape(config))
        assert plan is not None
        memory = ASCEND_MEMORY_GIB if product == "ascend" else DEVICE_MEMORY_GIB[product]
        errors = [f.path.rsplit(".", 1)[-1] for f in model_fit_findings(spec, config) if f.severity == "error"]
        device = "Ascend 910 (64 GB)" if product == "ascend" else f"{product.removeprefix('NVIDIA-')} ({memory:.0f} GiB)"
        verdict = "fits" if not errors else "refused (" + ", ".join(dict.fromkeys(errors)) + ")"
        lines.append(
            f"| Qwen2.5-{model} | {nodes} x 8 {device}, TP {tp} | {'on' if offload else 'off'} | {plan.rollout.total_gib:.0f} | {plan.update.total_gib:.0f} | "
            f"{plan.log_prob.total_gib:.0f} | {verdict} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(fit_table())  # noqa: T201
