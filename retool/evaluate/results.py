"""Per-sample results (one jsonl line each) and the run summary computed from them.

The summary is a pure function of the results, so it can be recomputed from a results file
(``summarize(read_results(path))``) and tested against hand-computed tables.
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from retool.recipe.metrics import validation_metrics


@dataclass
class SampleResult:
    """One sample of one problem: the conversation, its score and its loop figures."""

    problem_index: int
    sample_index: int
    data_source: str
    ground_truth: str
    pred: str | None
    score: float
    acc: bool
    turns: int
    tool_calls: int
    tool_failures: int
    stop: str
    elapsed_s: float
    tool_seconds: float = 0.0
    usage: dict[str, int] = field(default_factory=dict)
    error: str | None = None
    messages: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> SampleResult:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


def read_results(path: Path) -> list[SampleResult]:
    return [SampleResult.from_mapping(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def accuracy_metrics(results: Sequence[SampleResult]) -> dict[str, float]:
    """mean@k, maj@k, best@k (verl's bootstrap) and pass@k per data source, named as verl's validation
    names them (``val-core/aime_2024/acc/mean@30``), so eval-stage and ``retool eval`` figures line up."""
    if not results:
        return {}
    return validation_metrics(
        [r.data_source for r in results],
        [f"{r.data_source}/{r.problem_index}" for r in results],
        {"reward": [r.score for r in results], "acc": [float(r.acc) for r in results], "pred": [r.pred or "" for r in results]},
    )


def loop_metrics(results: Sequence[SampleResult]) -> dict[str, float]:
    """Turns and tool-call statistics of the whole run (``eval/...``)."""
    if not results:
        return {}
    turns = [r.turns for r in results]
    calls = [r.tool_calls for r in results]
    total_calls = sum(calls)
    stops = Counter(r.stop for r in results)
    metrics = {
        "eval/samples": float(len(results)),
        "eval/errors": float(sum(1 for r in results if r.error)),
        "eval/turns_mean": statistics.fmean(turns),
        "eval/turns_max": float(max(turns)),
        "eval/tool_calls_mean": statistics.fmean(calls),
        "eval/tool_calls_max": float(max(calls)),
        "eval/tool_calls_total": float(total_calls),
        "eval/tool_calls_failure_rate": (sum(r.tool_failures for r in results) / total_calls) if total_calls else 0.0,
        "eval/samples_with_tool_call": sum(1 for c in calls if c) / len(results),
        "eval/answer_extracted": sum(1 for r in results if r.pred) / len(results),
        "eval/elapsed_s_mean": statistics.fmean(r.elapsed_s for r in results),
    }
    for stop, count in sorted(stops.items()):
        metrics[f"eval/stop_{stop}"] = count / len(results)
    for key in ("prompt_tokens", "completion_tokens"):
        values = [r.usage[key] for r in results if key in r.usage]
        if values:
            metrics[f"eval/{key}_mean"] = statistics.fmean(values)
    return metrics


def summarize(results: Iterable[SampleResult]) -> dict[str, float]:
    """Figures of the samples that completed; a sample that failed at the endpoint was not measured,
    so it is counted in ``eval/samples`` and ``eval/errors`` only (scoring it 0 would read as a model
    that answered wrong). With no sample completed there are no accuracy or loop figures at all."""
    results = list(results)
    completed = [r for r in results if r.error is None]
    counts = {"eval/samples": float(len(results)), "eval/errors": float(len(results) - len(completed))}
    return {**accuracy_metrics(completed), **loop_metrics(completed), **counts}
