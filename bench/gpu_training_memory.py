"""Measure the actor's training memory on a real GPU and compare it with ``retool/spec/memory_fit.py``.

Why: memory_fit's per-token constants (checkpointed layer inputs, one recomputed layer, logits, the
log-prob forward) decide which runs the preflight and the webhook refuse, and they were derived on
paper. This script measures them the way verl 0.6.1's FSDP actor runs the model, so the constants can
be checked against hardware (issue 29; results in bench/RESULTS.md, data in bench/data/).

Two modes:

``measure`` runs on the GPU machine, where only torch and transformers are installed, so it imports
nothing from retool. It builds Qwen2.5-shaped models with random weights (no downloads), some with
fewer layers than the real model so that they fit one device: the per-layer and per-token terms are
what memory_fit needs, and two layer counts of one shape separate the per-layer term by differencing.
Each model runs as verl's actor does:

- fp32 master parameters, bf16 compute through FSDP2 ``fully_shard`` with
  ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32, cast_forward_inputs=True)`` on a
  one-rank process group, wrapped like verl's ``apply_fsdp2`` (each decoder layer, the embedding when
  it is not tied, then the root). This is representative where ``torch.autocast`` is not: FSDP
  gathers each layer's bf16 parameters and frees them after use, keeps the root's (lm_head, final
  norm) through forward and backward, reduces gradients into fp32, and the residual stream is bf16;
  autocast would instead cache a bf16 copy of every weight for the whole forward and keep the
  residual stream in fp32 (the embedding is not autocast). verl's default strategy ``fsdp`` (FSDP1)
  gathers and frees the same way; with one rank there is no sharding, so the static memory is
  memory_fit's 16 B/param x P and the activation terms are those of one device.
- gradient checkpointing on (``use_reentrant=False``, as verl sets it), ``use_cache=False``, sdpa
  attention, one packed sequence of T tokens (batch 1, verl's remove-padding path).
- log-probs as verl computes them without flash-attn's cross-entropy kernel:
  ``logits.div_(temperature)`` then ``logprobs_from_logits_v2`` (a per-row log_softmax + gather for
  bf16 logits), a PPO clipped loss, backward, grad-norm clipping and an AdamW step. The log-prob
  phase is the same forward under ``torch.no_grad()`` in eval mode, with and without
  ``entropy_from_logits`` (verl computes the old policy's entropy there; the reference's log-probs
  without it).

Recorded per phase with ``torch.cuda.reset_peak_memory_stats`` / ``max_memory_allocated``: the static
memory (parameters, gradients and Adam moments after one step), the first optimizer step's peak above
what was allocated before it (it creates the moments, so its peak above the static memory is that
less the moments),
and for each T the update's (forward + backward) and the log-prob forward's peak above what was
allocated before. The update runs with the gradients of the previous step still present (gradient
accumulation over micro-batches), so its peak above static is the activations alone. One case that
runs out of memory is recorded as such and the rest go on; the JSON is written after every case.

``compare`` runs here (it imports retool) and prints, per case, the measured peaks next to
memory_fit's terms for the same shape and T, computed by memory_fit's own functions.

What one device cannot show: sharding across N ranks (the static term divides by N, the activation
and root-parameter terms do not), NCCL's buffers, and vLLM's memory (not installed there).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

GIB = 2**30


def _shape(hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int, vocab: int, tied: bool) -> dict[str, Any]:
    return {
        "hidden_size": hidden, "intermediate_size": intermediate, "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "vocab_size": vocab, "tie_word_embeddings": tied,
    }  # fmt: skip


# Qwen2.5 config.json values. 7B/32B/72B are memory_fit.QWEN25_SHAPES (repeated: this mode cannot
# import retool; ``compare`` checks they still agree); 0.5B/1.5B from their config.json.
SHAPES: dict[str, dict[str, Any]] = {
    "0.5B": _shape(896, 4864, 24, 14, 2, 151936, tied=True),
    "1.5B": _shape(1536, 8960, 28, 12, 2, 151936, tied=True),
    "7B": _shape(3584, 18944, 28, 28, 4, 152064, tied=False),
    "32B": _shape(5120, 27648, 64, 40, 8, 152064, tied=False),
    "72B": _shape(8192, 29568, 80, 64, 8, 152064, tied=False),
    # Held out of the fit (--holdout): Qwen2.5-3B-Instruct and -14B-Instruct config.json values.
    "3B": _shape(2048, 11008, 36, 16, 2, 151936, tied=True),
    "14B": _shape(5120, 13824, 48, 40, 8, 152064, tied=False),
}
# (shape, layers, token counts) in the order they run: the big shapes first (they matter for the fit
# table), the two layer counts of one shape next to each other. None = the model's own layer count.
CASES: tuple[tuple[str, int | None, tuple[int, ...]], ...] = (
    ("7B", 2, (2048, 4096, 8192, 16384)),
    ("7B", 4, (2048, 4096, 8192, 16384)),
    ("32B", 1, (2048, 4096, 8192, 16384)),
    ("32B", 2, (2048, 4096, 8192, 16384)),
    ("1.5B", None, (2048, 4096, 8192, 16384)),
    ("0.5B", None, (2048, 4096, 8192, 16384)),
    ("72B", 1, (2048, 4096, 8192)),
)
HOLDOUT: tuple[tuple[str, int | None, tuple[int, ...]], ...] = (
    ("3B", None, (3072, 8192)),
    ("14B", 3, (6144, 12288)),
    ("7B", 3, (24576,)),
)
"""Shapes, layer counts and token counts the constants were NOT fitted on (a second run checks them out of sample)."""
TINY: tuple[tuple[str, dict[str, Any], tuple[int, ...]], ...] = (("tiny", _shape(64, 128, 2, 4, 2, 512, tied=False), (64, 128)),)


# --- verl 0.6.1 verl/utils/torch_functional.py, the path without flash-attn's cross-entropy ----------


def logprobs_from_logits_v2(logits, labels):
    """verl's ``logprobs_from_logits_v2``: for bf16 logits a per-row log_softmax and gather."""
    import torch
    from torch.nn import functional

    if logits.dtype in [torch.float32, torch.float64]:
        logits_labels = torch.gather(logits, dim=-1, index=labels.unsqueeze(-1)).squeeze(-1)
        logsumexp_values = torch.stack([torch.logsumexp(logit, dim=-1) for logit in logits])
        return logits_labels - logsumexp_values
    rows = []
    for row_logits, row_labels in zip(logits, labels, strict=True):
        row_logprobs = functional.log_softmax(row_logits, dim=-1)
        rows.append(row_logprobs.gather(dim=-1, index=row_labels.unsqueeze(-1)).squeeze(-1))
    return torch.stack(rows)


def entropy_from_logits(logits):
    """verl's ``entropy_from_logits`` (the old policy's entropy, computed in the log-prob phase)."""
    import torch

    pd = torch.nn.functional.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - torch.sum(pd * logits, dim=-1)


# --- measuring ----------------------------------------------------------------------------------------


class Memory:
    """Peak and current allocation on the device; zeros on CPU (the CPU run only checks the code path)."""

    def __init__(self, device) -> None:
        import torch

        self.torch = torch
        self.cuda = device.type == "cuda"

    def allocated(self) -> int:
        return self.torch.cuda.memory_allocated() if self.cuda else 0

    def reset(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()
            self.torch.cuda.reset_peak_memory_stats()

    def peak(self) -> tuple[int, int]:
        if not self.cuda:
            return 0, 0
        self.torch.cuda.synchronize()
        return self.torch.cuda.max_memory_allocated(), self.torch.cuda.max_memory_reserved()


def _init_process_group(device) -> Any:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=0, world_size=1)
    return init_device_mesh(device.type, (1,))


def _build(shape: dict[str, Any], layers: int, device, mesh) -> Any:
    """A Qwen2 model with random fp32 weights, checkpointed and wrapped like verl's ``apply_fsdp2``."""
    import torch
    from torch import nn
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**{**shape, "num_hidden_layers": layers}, max_position_embeddings=32768, use_cache=False, attn_implementation="sdpa", rms_norm_eps=1e-6, rope_theta=1e6)
    with torch.device(device):
        model = Qwen2ForCausalLM(config)
    model.to(dtype=torch.float32)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, cast_forward_inputs=True)
    kwargs = {"mesh": mesh, "mp_policy": mp, "reshard_after_forward": True}
    no_split = set(getattr(model, "_no_split_modules", None) or ["Qwen2DecoderLayer"])
    for module in list(model.modules()):
        if type(module).__name__ in no_split or (isinstance(module, nn.Embedding) and not config.tie_word_embeddings):
            fully_shard(module, **kwargs)
    fully_shard(model, **kwargs)
    return model


def _batch(tokens: int, vocab: int, device) -> tuple[Any, Any, Any]:
    import torch

    ids = torch.randint(0, vocab, (1, tokens), device=device)
    positions = torch.arange(tokens, device=device).unsqueeze(0)
    labels = torch.roll(ids, shifts=-1, dims=1).squeeze(0)  # verl: input_ids_rmpad_rolled
    return ids, positions, labels


def _forward_logprobs(model, ids, positions, labels, entropy: bool) -> tuple[Any, Any, str]:
    """verl dp_actor ``_forward_micro_batch`` with remove-padding: logits (T, V), div_ temperature, log-probs."""
    out = model(input_ids=ids, attention_mask=None, position_ids=positions, use_cache=False)
    logits = out.logits.squeeze(0)
    logits.div_(1.0)
    log_probs = logprobs_from_logits_v2(logits, labels)
    ent = entropy_from_logits(logits) if entropy else None
    return log_probs, ent, str(logits.dtype)


def _update(model, ids, positions, labels) -> str:
    """One micro-batch of the actor update: forward, PPO clipped loss, backward (gradients accumulate)."""
    import torch

    model.train()
    log_probs, _, dtype = _forward_logprobs(model, ids, positions, labels, entropy=False)
    old = log_probs.detach() + 0.01
    advantages = torch.ones_like(old)
    ratio = torch.exp(log_probs - old)
    loss = torch.max(-advantages * ratio, -advantages * torch.clamp(ratio, 0.8, 1.28)).mean()
    loss.backward()
    del log_probs, ratio, loss
    return dtype


def _step(model, optimizer) -> None:
    import torch

    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()


def _measure_case(name: str, shape: dict[str, Any], layers: int, tokens: tuple[int, ...], device, mesh, result: dict[str, Any]) -> None:
    import torch

    mem = Memory(device)
    case: dict[str, Any] = {"name": name, "shape": shape, "layers": layers, "phases": {}}
    result["cases"].append(case)
    model = optimizer = None
    try:
        t0 = time.perf_counter()
        model = _build(shape, layers, device, mesh)
        case["parameters"] = sum(p.numel() for p in model.parameters())
        case["param_bytes"] = mem.allocated()
        case["build_s"] = round(time.perf_counter() - t0, 1)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, betas=(0.9, 0.999), weight_decay=0.01)
        ids, positions, labels = _batch(tokens[0], shape["vocab_size"], device)
        case["logits_dtype"] = _update(model, ids, positions, labels)
        case["attn_implementation"] = getattr(model.config, "_attn_implementation", None)
        before = mem.allocated()
        mem.reset()
        _step(model, optimizer)
        peak, reserved = mem.peak()
        case["static_bytes"] = mem.allocated()  # fp32 params + grads (kept: accumulation) + Adam moments
        case["before_first_step_bytes"] = before  # params + grads: the first step creates the moments
        case["first_step_peak_above_before"] = peak - before
        case["step_reserved_peak"] = reserved
        del ids, positions, labels
    except torch.OutOfMemoryError as exc:
        case["error"] = f"OutOfMemoryError while building or in the first step: {str(exc)[:200]}"
        del model, optimizer
        _free()
        return
    for t in tokens:
        row: dict[str, Any] = {}
        case["phases"][str(t)] = row
        for phase in ("update", "log_prob", "log_prob_entropy"):
            try:
                ids, positions, labels = _batch(t, shape["vocab_size"], device)
                _free(empty_cache=False)
                base = mem.allocated()
                mem.reset()
                t0 = time.perf_counter()
                if phase == "update":
                    _update(model, ids, positions, labels)
                else:
                    model.eval()
                    with torch.no_grad():
                        outputs = _forward_logprobs(model, ids, positions, labels, entropy=phase == "log_prob_entropy")
                    del outputs
                peak, reserved = mem.peak()
                row[phase] = {"base_bytes": base, "peak_above_base": peak - base, "reserved_peak": reserved, "seconds": round(time.perf_counter() - t0, 2)}
            except torch.OutOfMemoryError as exc:
                row[phase] = {"error": f"OutOfMemoryError: {str(exc)[:160]}"}
            finally:
                ids = positions = labels = None
                _free()
        cells = [f"{k} OOM" if "error" in v else f"{k} {v['peak_above_base'] / GIB:.2f} GiB" for k, v in row.items()]
        print(f"  {name} L={layers} T={t}: " + ", ".join(cells), flush=True)
    del model, optimizer
    _free()


def _free(empty_cache: bool = True) -> None:
    import torch

    gc.collect()
    if empty_cache and torch.cuda.is_available():
        torch.cuda.empty_cache()


def measure(out: Path, tiny: bool, budget_s: float, *, holdout: bool = False) -> dict[str, Any]:
    import torch
    import transformers

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    mesh = _init_process_group(device)
    result: dict[str, Any] = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
        "device_total_bytes": torch.cuda.get_device_properties(0).total_memory if device.type == "cuda" else 0,
        "method": "FSDP2 fully_shard, 1 rank, MixedPrecisionPolicy(bf16 params, fp32 reduce); gradient checkpointing; sdpa; one packed sequence; logprobs_from_logits_v2; AdamW",
        "cases": [],
    }
    if device.type == "cuda":
        torch.cuda.init()
        free, total = torch.cuda.mem_get_info()
        result["non_torch_bytes_at_start"] = total - free - torch.cuda.memory_reserved()
    chosen = HOLDOUT if holdout else CASES
    cases = [(n, s, s["num_hidden_layers"], t) for n, s, t in TINY] if tiny else [(n, SHAPES[n], layers or SHAPES[n]["num_hidden_layers"], t) for n, layers, t in chosen]
    start = time.perf_counter()
    for name, shape, layers, tokens in cases:
        if time.perf_counter() - start > budget_s:
            result["cases"].append({"name": name, "layers": layers, "shape": shape, "skipped": f"over the {budget_s:.0f} s budget"})
            continue
        print(f"{name} with {layers} layers", flush=True)
        _measure_case(name, shape, layers, tokens, device, mesh, result)
        if device.type == "cuda":
            free, total = torch.cuda.mem_get_info()
            result["non_torch_bytes_after_" + f"{name}_{layers}"] = total - free - torch.cuda.memory_reserved()
        result["elapsed_s"] = round(time.perf_counter() - start, 1)
        out.write_text(json.dumps(result, indent=1))
    out.write_text(json.dumps(result, indent=1))
    return result


# --- comparing with memory_fit --------------------------------------------------------------------------


def compare(path: Path) -> str:
    """Measured peaks per case next to memory_fit's terms for the same shape and tokens (its own functions)."""
    from retool.spec import memory_fit as mf

    data = json.loads(path.read_text())
    for name, shape in mf.QWEN25_SHAPES.items():
        ours = {k: SHAPES[name][k] for k in shape}
        assert ours == shape, f"{name}: SHAPES differs from memory_fit.QWEN25_SHAPES"
    lines = [
        f"device {data['device']}, torch {data['torch']}, transformers {data['transformers']}",
        "",
        "| model | layers | T | update measured | update estimated | ratio | log-prob measured | log-prob + entropy measured | log-prob estimated | ratio |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    statics = []
    for case in data["cases"]:
        if "phases" not in case or "static_bytes" not in case:
            lines.append(f"| {case['name']} | {case['layers']} | - | {case.get('error') or case.get('skipped')} | | | | | | |")
            continue
        s = case["shape"]
        shape = mf.Shape(
            parameters=case["parameters"], layers=case["layers"], hidden_size=s["hidden_size"], intermediate_size=s["intermediate_size"],
            vocab_size=s["vocab_size"], kv_heads=s["num_key_value_heads"], head_dim=s["hidden_size"] // s["num_attention_heads"], dtype_bytes=2,
        )  # fmt: skip
        step = _step_above_static(case)
        statics.append((case, case["static_bytes"], mf.ACTOR_BYTES_PER_PARAM * case["parameters"], step))
        for t, row in case["phases"].items():
            tokens = int(t)
            update_est = sum(term.gib for term in mf.update_activation_terms(tokens, shape, case["parameters"]))
            log_prob_est = sum(term.gib for term in mf.log_prob_activation_terms(tokens, shape, mf.LOGIT_BYTES_FORWARD))
            cells = []
            for phase, est in (("update", update_est), ("log_prob", None), ("log_prob_entropy", log_prob_est)):
                m = row.get(phase, {})
                measured = m.get("peak_above_base", 0) / GIB if "error" not in m else None
                if phase == "update" and measured is not None:  # the update phase ends with the optimizer step
                    measured = max(measured, step / GIB)
                cells.append("OOM" if measured is None else f"{measured:.2f}")
                if est is not None:
                    cells.append(f"{est:.2f}")
                    cells.append(f"{est / measured:.2f}" if measured else "-")
            u, ue, ur, lp, lpe, lpest, lpr = cells
            lines.append(f"| {case['name']} | {case['layers']} | {tokens} | {u} | {ue} | {ur} | {lp} | {lpe} | {lpest} | {lpr} |")
    lines += [
        "",
        "GiB above what was allocated before the phase; update measured = the larger of forward + backward and the optimizer step;",
        "ratio = estimated / measured (below 1: memory_fit under-estimates)",
        "",
        "| model | layers | parameters | static measured GiB | 16 B x P GiB | step peak above static GiB | B/param |",
        "|---|---|---|---|---|---|---|",
    ]
    for case, measured, est, step in statics:
        p = case["parameters"]
        lines.append(f"| {case['name']} | {case['layers']} | {p / 1e9:.2f}B | {measured / GIB:.2f} | {est / GIB:.2f} | {step / GIB:.2f} | {step / p:.2f} |")
    return "\n".join(lines)


def _step_above_static(case: dict[str, Any]) -> float:
    """The optimizer step's peak above the static memory.

    The first step creates AdamW's two fp32 moments (8 B/param), so its peak above what was there
    before is the moments plus the step's temporaries. The first GPU run wrote that peak as
    ``step_peak_above_static`` without ``before_first_step_bytes``; there the moments are the static
    memory less the parameters and gradients (8 B/param by AdamW's definition).
    """
    if "before_first_step_bytes" in case:
        return case["before_first_step_bytes"] + case["first_step_peak_above_before"] - case["static_bytes"]
    return case["step_peak_above_static"] - 8 * case["parameters"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    m = sub.add_parser("measure", help="run the models on this machine's device and write JSON")
    m.add_argument("--out", type=Path, default=Path("gpu_training_memory.json"))
    m.add_argument("--tiny", action="store_true", help="one tiny config (a CPU check that the code runs end to end)")
    m.add_argument("--holdout", action="store_true", help="the held-out cases (HOLDOUT) instead of the fitted ones")
    m.add_argument("--budget-s", type=float, default=210.0, help="skip the cases that would start after this many seconds")
    c = sub.add_parser("compare", help="measured vs memory_fit's terms (needs retool)")
    c.add_argument("json", type=Path)
    args = parser.parse_args(argv)
    if args.mode == "measure":
        measure(args.out, args.tiny, args.budget_s, holdout=args.holdout)
        print(f"wrote {args.out}")
    else:
        print(compare(args.json))
    return 0


if __name__ == "__main__":
    sys.exit(main())
