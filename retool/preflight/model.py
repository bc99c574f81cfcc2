"""``model``: the run against the model's config.json (``retool.spec.model_fit``) and its tokenizer's size.

Memory is checked phase by phase per device (``retool.spec.memory_fit``: the rollout engine beside
what the trainer keeps, the actor update, log-probabilities); a refusal carries its arithmetic.

The tokenizer directory the preflight reads is the staged model (``models/base`` on the PVC), so its
config.json is at hand; a directory of tokenizer files only (a local ``--tokenizer``) skips the
check with the reason. Errors fail the check (a permanent failure: the run cannot fit the model
on any attempt); warnings keep the run going and are reported.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from retool.preflight.checks import CheckResult
from retool.spec.model import RetoolRunSpec
from retool.spec.model_fit import model_fit_findings, model_shape, read_model_config, rollout_memory


def check_model(spec: RetoolRunSpec, source: str, tokenizer: Any) -> CheckResult:
    started = time.monotonic()
    result = _check_model(spec, source, tokenizer)
    return replace(result, details={**result.details, "seconds": round(time.monotonic() - started, 4)})


def _check_model(spec: RetoolRunSpec, source: str, tokenizer: Any) -> CheckResult:
    config_file = Path(source) / "config.json"
    if not config_file.is_file():
        return CheckResult("model", "run", "skipped", f"no config.json at {source}: the model's context window, heads and memory were not checked")
    try:
        config = read_model_config(config_file)
    except ValueError as err:
        return CheckResult("model", "run", "failed", str(err))
    tokenizer_size = len(tokenizer) if tokenizer is not None else None
    findings = model_fit_findings(spec, config, tokenizer_size=tokenizer_size)
    shape = model_shape(config)
    memory = rollout_memory(spec, shape)
    details: dict[str, Any] = {
        "config": str(config_file),
        "context_window": shape.context_window,
        "max_model_len": spec.rl.max_prompt_length + spec.rl.max_response_length,
        "attention_heads": shape.attention_heads,
        "kv_heads": shape.kv_heads,
        "vocab_size": shape.vocab_size,
        "tokenizer_size": tokenizer_size,
        "findings": [{"severity": f.severity, "path": f.path, "message": f.message} for f in findings],
    }
    if memory is not None:
        details["rollout_memory_gib"] = {k: round(v, 2) for k, v in memory.items()}
    errors = [f for f in findings if f.severity == "error"]
    if errors:
        return CheckResult("model", "run", "failed", "; ".join(str(f) for f in errors), details)
    if findings:
        return CheckResult("model", "run", "warning", "; ".join(str(f) for f in findings), details)
    summary = f"{details['max_model_len']} tokens fit the {shape.context_window}-token window; {shape.attention_heads} heads split over the parallel sizes"
    if memory is not None:
        summary += f"; rollout weights {memory['weights_gib']:.1f} GiB of {memory['budget_gib']:.1f} GiB per device leave {memory['kv_cache_gib']:.1f} GiB of KV cache"
        if "update_phase_gib" in memory:
            summary += (
                f"; per device the rollout phase takes {memory['rollout_phase_gib']:.1f} GiB, the actor update {memory['update_phase_gib']:.1f} GiB "
                f"and log-probabilities {memory['log_prob_phase_gib']:.1f} GiB of {memory['device_gib']:.1f} GiB"
            )
    return CheckResult("model", "run", "passed", summary, details)
