"""Tool-use dynamics of one batch of rollouts: the figures the ReTool paper plots during RL (pure).

The agent loop (:mod:`retool.recipe.verl_plugins.agent_loop`) leaves one record per response in
verl's batch (``non_tensor_batch["retool_tools"]``, see :func:`tool_record`); the trainer hands the
records, each response's correctness and its length to :func:`reduce_dynamics`, which returns
MLflow-ready metrics under one prefix (``tool/`` for training steps, ``val-tool/`` for validation
and the eval stage), so the MLflow UI groups them in one section beside verl's own.

What each figure means (paper §4, "code ratio", "code lines", "code pass rate", "code invocation
timing"):

- ``code_ratio``: share of responses that called the interpreter at least once.
- ``calls_per_response_mean|max``: interpreter calls per response; ``hit_max_turns_ratio`` the share
  of responses the agent loop stopped because they reached ``maxTurns``.
- ``code_lines_per_response_mean``: non-blank lines of code a response runs, all its calls together,
  over responses with a call; the code is what the tool runs (``extract_code``: the fenced block of
  an argument written as Markdown, without its fence lines) (the paper's "code lines", a per-response figure);
  ``code_lines_per_call_mean`` the same per call.
- ``outcome_<success|error|timeout|sandbox_failure>_count`` and ``.../rate`` (per call): how the
  calls ended. ``error`` is the model's fault (an exception, bad arguments, a malformed call),
  ``sandbox_failure`` the platform's (overloaded, unreachable, sandbox error).
- ``code_pass_rate_correct|incorrect``: share of calls that ran successfully, among the calls of
  correct (resp. incorrect) responses.
- ``first_call_position_mean``: response tokens before the first call *begins* (its ``<tool_call>``
  token), as a fraction of the whole response (lower = the model reaches for the tool earlier), over
  responses with a call: 0 for a response that opens with a call.
- ``response_length_correct|incorrect_mean``: response tokens (with interpreter output) of correct
  and incorrect responses; ``correct_ratio`` the share of correct responses.

A response with no record (the text-only baseline's ``single_turn_agent``) counts as one without calls.

>>> metrics = reduce_dynamics([tool_record(["ok"], [3], 40), None], [True, False], [100, 50])
>>> metrics["tool/code_ratio"], metrics["tool/first_call_position_mean"], metrics["tool/code_pass_rate_correct"]
(0.5, 0.4, 1.0)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from retool.recipe.tool.interpreter import extract_code

RECORD_KEY = "retool_tools"
"""The agent loop's extra field, hence the key in verl's ``non_tensor_batch``."""

TRAIN_PREFIX = "tool"
VALIDATION_PREFIX = "val-tool"

OUTCOME_CLASSES = ("success", "error", "timeout", "sandbox_failure")
MALFORMED = "malformed"
"""The outcome of a call verl could not hand to the tool (arguments not JSON, unknown tool name)."""

OUTCOME_CLASS = {
    "ok": "success",
    "code_failed": "error",
    "bad_arguments": "error",
    MALFORMED: "error",
    "timeout": "timeout",
    "overloaded": "sandbox_failure",
    "unavailable": "sandbox_failure",
    "sandbox_error": "sandbox_failure",
    "tool_error": "sandbox_failure",
}
"""The code-interpreter tool's outcome names (``retool.recipe.tool``) grouped into the four classes."""


def outcome_class(outcome: str) -> str:
    """The class of one call's outcome; an outcome this module does not know counts as ``error``."""
    return OUTCOME_CLASS.get(outcome, "error")


def code_lines(code: Any) -> int:
    """Non-blank lines of the code a call's ``code`` argument runs (0 for anything that is not text).

    The tool runs :func:`retool.recipe.tool.interpreter.extract_code` of the argument, so a
    ```` ```python ```` fence and its closing line are not code, and neither is prose around the block.
    """
    if not isinstance(code, str):
        return 0
    return sum(1 for line in extract_code(code).splitlines() if line.strip())


def tool_record(
    outcomes: Sequence[str],
    lines: Sequence[int],
    first_call_at: int | None,
    *,
    hit_max_turns: bool = False,
    outputs: Sequence[str] = (),
    response_tokens: int | None = None,
) -> dict[str, Any]:
    """One response's record as the agent loop stores it (plain types: it travels through Ray and numpy).

    ``first_call_at``: response tokens before the first call begins (None without calls);
    ``outputs``: the last line of each call's output, for the copied-answer signal of the reward watch;
    ``response_tokens``: the response's length as verl keeps it (so the trainer need not sum a mask).
    """
    if len(outcomes) != len(lines):
        raise ValueError(f"{len(outcomes)} outcomes but {len(lines)} line counts")
    return {
        "outcomes": list(outcomes),
        "code_lines": [int(n) for n in lines],
        "first_call_at": -1 if first_call_at is None or not outcomes else int(first_call_at),
        "hit_max_turns": bool(hit_max_turns),
        "outputs": list(outputs),
        "response_tokens": -1 if response_tokens is None else int(response_tokens),
    }


def _record(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def reduce_dynamics(records: Sequence[Any], correct: Sequence[bool] | np.ndarray, response_lengths: Sequence[int] | np.ndarray, prefix: str = TRAIN_PREFIX) -> dict[str, float]:
    """The batch's tool-use metrics (see the module docstring); empty for an empty batch."""
    n = len(records)
    if len(correct) != n or len(response_lengths) != n:
        raise ValueError(f"{n} records, {len(correct)} correctness values and {len(response_lengths)} lengths: one of each per response")
    if n == 0:
        return {}
    correct = np.asarray(correct, dtype=bool)
    lengths = np.asarray(response_lengths, dtype=np.float64)
    recs = [_record(r) for r in records]
    calls = np.fromiter((len(r.get("outcomes", ())) for r in recs), dtype=np.int64, count=n)
    first_at = np.fromiter((r.get("first_call_at", -1) for r in recs), dtype=np.float64, count=n)
    hit_max = np.fromiter((bool(r.get("hit_max_turns", False)) for r in recs), dtype=bool, count=n)
    classes = [outcome_class(o) for r in recs for o in r.get("outcomes", ())]
    lines = np.fromiter((x for r in recs for x in r.get("code_lines", ())), dtype=np.float64)
    call_correct = np.repeat(correct, calls)
    succeeded = np.fromiter((c == "success" for c in classes), dtype=bool, count=len(classes))

    p = prefix.rstrip("/")
    total_calls = int(calls.sum())
    with_calls = calls > 0
    metrics: dict[str, float] = {
        f"{p}/responses": float(n),
        f"{p}/correct_ratio": float(correct.mean()),
        f"{p}/code_ratio": float(with_calls.mean()),
        f"{p}/calls_per_response_mean": float(calls.mean()),
        f"{p}/calls_per_response_max": float(calls.max()),
        f"{p}/hit_max_turns_ratio": float(hit_max.mean()),
        f"{p}/calls": float(total_calls),
    }
    if lines.size:
        metrics[f"{p}/code_lines_per_call_mean"] = float(lines.mean())
    if with_calls.any():
        per_response = np.fromiter((sum(r.get("code_lines", ())) for r, called in zip(recs, with_calls, strict=True) if called), dtype=np.float64)
        metrics[f"{p}/code_lines_per_response_mean"] = float(per_response.mean())
    for name in OUTCOME_CLASSES:
        count = sum(1 for c in classes if c == name)
        metrics[f"{p}/outcome_{name}_count"] = float(count)
        if total_calls:
            metrics[f"{p}/outcome_{name}_rate"] = count / total_calls
    for label, mask in (("correct", call_correct), ("incorrect", ~call_correct)):
        if mask.any():
            metrics[f"{p}/code_pass_rate_{label}"] = float(succeeded[mask].mean())
    positioned = with_calls & (first_at >= 0) & (lengths > 0)
    if positioned.any():
        metrics[f"{p}/first_call_position_mean"] = float(np.minimum(first_at[positioned] / lengths[positioned], 1.0).mean())
    for label, mask in (("correct", correct), ("incorrect", ~correct)):
        if mask.any():
            metrics[f"{p}/response_length_{label}_mean"] = float(lengths[mask].mean())
    return metrics
