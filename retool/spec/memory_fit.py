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
    inputs kept at each checkpoint (layers x T x hidden x 2 bytes), and the largest of what comes on
    top of them at different moments: the logits' peak (T x (vocabulary x 8 + hidden x 8) bytes: bf16
    logits, the per-row log-softmax kept for the backward pass, their gradients, the final hidden
    states and theirs), one layer recomputed in the backward pass with its gradients
    (T x (6 x hidden + 4 x intermediate) x 2 bytes x 2), FSDP's root (lm_head) and the embedding
    gathered in bf16 with their gradients (12 bytes x vocabulary x hidden, unsharded whatever N) and
    AdamW's step (4 bytes x P / N: torch's foreach AdamW keeps a temporary of the second moment);
  - ``TRAINER_OVERHEAD_GIB`` outside PyTorch's tensors (CUDA context, NCCL), and vLLM's CUDA graphs,
    which sleeping does not free.
Log-probabilities (old policy and reference, forward only, ``log_prob_max_token_len_per_gpu``
tokens T' per device): the actor's fp32 parameters (all 16 bytes x P / N when not offloaded), the
reference model's bf16 parameters when KL is on, the largest of the logits with verl's entropy
(T' x vocabulary x 6 bytes: the old policy's pass computes it: bf16 logits, the softmax and its
product with the logits), one layer's activations (T' x (6 x hidden + 4 x intermediate) x 2 bytes)
and lm_head with the gathered embedding (6 bytes x vocabulary x hidden); with entropy chunking (the
Ascend profile, not measured) one layer plus T' x vocabulary x 2 bytes; and the same overhead.

The per-token and per-parameter bytes were measured on one NVIDIA H100 80GB HBM3 with verl's way of
running the actor (bench/gpu_training_memory.py; bench/RESULTS.md, "Training memory on a real GPU
(issue 29)"; the data in bench/data/gpu_training_memory_h100.json, which a test holds these terms
to). The earlier paper values summed the recomputed layer with the logits and took 6 and 4 bytes
for the logits: the update 10-17 % low for 0.5B-1.5B and 17 % high for 32B at long T, the log-prob
pass 2-28 % low (0.5B worst), and both blind to the root's and the optimizer step's peaks, which
decide short micro-batches (2-4k tokens: 17-78 % low). One device cannot show FSDP over N ranks
(the root term is taken unsharded, the step's temporary sharded), NCCL's buffers or vLLM.

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
LOGIT_BYTES = 8
"""Actor update, per token and vocabulary entry: the bf16 logits, the per-row log-softmax kept for the
backward pass, and their gradients (bench/gpu_training_memory.py on one H100: 8.05-8.27 B; was 6)."""
LOGIT_HIDDEN_BYTES = 8
"""Actor update, per token and hidden unit beside the logits: the final hidden states and their
gradient (measured about 8 B: the update's peak is T x (8 x vocabulary + 8 x hidden) above the checkpoints)."""
ROOT_BYTES = 12
"""Actor update, per vocabulary x hidden: FSDP's root (lm_head) and the embedding gathered in bf16, their
bf16 gradients and the fp32 copies reduced from them, unsharded whatever N (measured 12.0 B on one rank; the peak
for short micro-batches)."""
OPTIMIZER_STEP_BYTES = 4
"""AdamW's step beyond the 16 B/param (torch's foreach AdamW, verl's default, keeps one fp32 temporary of the
second moment's square root: measured 4.0 B/param)."""
LOGIT_BYTES_FORWARD = 6
"""Log-probabilities (no gradient), per token and vocabulary entry: the actor's old log-probabilities come
with verl's entropy (``compute_log_prob(calculate_entropy=True)``): bf16 logits, the softmax and its product
with the logits (measured 6.0 B; 2.0 B without the entropy, the reference's pass; was 4)."""
LOGIT_BYTES_CHUNKED = 2
"""Log-probabilities with entropy chunking (the Ascend profile): the bf16 logits alone (not measured)."""
ROOT_BYTES_FORWARD = 6
"""Log-probabilities, per vocabulary x hidden: lm_head in bf16 and the embedding's gather (measured 6.0 B)."""


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


def update_activation_terms(tokens: int, shape: Shape, parameters_per_device: float) -> tuple[Term, ...]:
    """The actor update's memory above its 16 B/param for ``tokens`` tokens on one device.

    Measured on one H100 (bench/RESULTS.md, "Training memory on a real GPU"): above the parameters,
    gradients and moments the peak is the checkpointed layer inputs plus the largest of the logits'
    peak, FSDP's root parameters and gradients, and the optimizer step; one recomputed layer never
    coincides with the logits and is below them for every Qwen2.5 shape, so it is a candidate of the
    maximum rather than a summand (the sum over-estimated 32B by 17 %, and 8 B logits under-estimated
    0.5B by 17 %).
    """
    h, v = shape.hidden_size, shape.vocab_size
    layer = f"(6 x {h} + 4 x {shape.intermediate_size}) x 2 B x 2"
    candidates = {
        f"logits {tokens} tokens x ({v} x {LOGIT_BYTES} B + {h} x {LOGIT_HIDDEN_BYTES} B)": tokens * (v * LOGIT_BYTES + h * LOGIT_HIDDEN_BYTES),
        f"one recomputed layer with its gradients {tokens} tokens x {layer}": 2 * _layer_activation(tokens, shape),
        f"lm_head and embedding gathered with gradients {ROOT_BYTES} B x {v} x {h}": ROOT_BYTES * v * h,
        f"AdamW step {OPTIMIZER_STEP_BYTES} B x {parameters_per_device / 1e9:.1f}B params per device": OPTIMIZER_STEP_BYTES * parameters_per_device,
    }
    return (
        Term("checkpointed layer inputs", f"{shape.layers} layers x {tokens} tokens x {h} x 2 B", _gib(shape.layers * tokens * h * 2)),
        _largest(candidates),
    )


def _largest(candidates: dict[str, float]) -> Term:
    """One term for moments that do not coincide: the largest, each candidate's GiB in the arithmetic."""
    return Term("activation peak", "the largest of " + "; ".join(f"{what} ({_gib(b):.1f} GiB)" for what, b in candidates.items()), _gib(max(candidates.values())))


def log_prob_activation_terms(tokens: int, shape: Shape, logit_bytes: int) -> tuple[Term, ...]:
    """The log-prob forward's memory above the parameters for ``tokens`` tokens on one device (no gradient).

    Measured on one H100: the largest of the logits with the entropy's temporaries and the gathered
    lm_head/embedding; one layer's activations are freed before the logits and stay below them.
    With entropy chunking (``LOGIT_BYTES_CHUNKED``, the Ascend profile: torch_npu's cross-entropy and
    the chunks' temporaries, not measured) the layer and the logits stay summed, as before the
    measurement: a GPU run is no evidence to lower an Ascend estimate.
    """
    h, v = shape.hidden_size, shape.vocab_size
    if logit_bytes == LOGIT_BYTES_CHUNKED:
        return (
            Term("one layer's activations", f"{tokens} tokens x (6 x {h} + 4 x {shape.intermediate_size}) x 2 B", _gib(_layer_activation(tokens, shape))),
            Term("logits", f"{tokens} tokens x {v} x {logit_bytes} B", _gib(tokens * v * logit_bytes)),
        )
    candidates = {
        f"logits {tokens} tokens x {v} x {logit_bytes} B": tokens * v * logit_bytes,
        f"one layer {tokens} tokens x (6 x {h} + 4 x {shape.intermediate_size}) x 2 B": _layer_activation(tokens, shape),
        f"lm_head and embedding gathered {ROOT_BYTES_FORWARD} B x {v} x {h}": ROOT_BYTES_FORWARD * v * h,
    }
    return (_largest(candidates),)


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

    update_terms = [actor, *([ref] if ref_resident else []), *update_activation_terms(train_tokens, shape, p / devices), overhead, graphs]

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
