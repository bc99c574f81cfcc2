"""Per-sample results (one jsonl line each) and the run summary computed from them.

The summary is a pure function of the results so it can be recomputed from a results file
(``retool eval --summarize results.jsonl``) and tested against hand-computed tables.
"""

from __future__ import annotations

import json
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


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


def majority_vote(preds: Sequence[str | None], accs: Sequence[bool]) -> bool:
    """Whether the most frequent extracted answer is correct (ties go to the earliest sample;
    samples with no extracted answer do not vote; no votes at all counts as wrong)."""
    votes = Counter(p for p in preds if p is not None and p != "")
    if not votes:
        return False
    top = max(votes.values())
    for pred, acc in zip(preds, accs, strict=True):
        if pred is not None and votes.get(pred) == top:
            return bool(acc)
    return False


def accuracy_metrics(results: Sequence[SampleResult], n: int) -> dict[str, float]:
    """mean@n, maj@n and best@n per data source, named as verl's validation names them."""
    by_source: dict[str, dict[int, list[SampleResult]]] = defaultdict(lambda: defaultdict(list))
    for r in results:
        by_source[r.data_source][r.problem_index].append(r)
    metrics: dict[str, float] = {}
    for source, problems in sorted(by_source.items()):
        groups = [sorted(samples, key=lambda r: r.sample_index) for _, samples in sorted(problems.items())]
        prefix = f"val-core/{source}/acc"
        metrics[f"{prefix}/mean@{n}"] = statistics.fmean(statistics.fmean(float(r.acc) for r in g) for g in groups)
        metrics[f"{prefix}/maj@{n}/mean"] = statistics.fmean(float(majority_vote([r.pred for r in g], [r.acc for r in g])) for g in groups)
        metrics[f"{prefix}/best@{n}/mean"] = statistics.fmean(float(any(r.acc for r in g)) for g in groups)
    return metrics


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
        "eval/turns/mean": statistics.fmean(turns),
        "eval/turns/max": float(max(turns)),
        "eval/tool_calls/mean": statistics.fmean(calls),
        "eval/tool_calls/max": float(max(calls)),
        "eval/tool_calls/total": float(total_calls),
        "eval/tool_calls/failure_rate": (sum(r.tool_failures for r in results) / total_calls) if total_calls else 0.0,
        "eval/samples_with_tool_call": sum(1 for c in calls if c) / len(results),
        "eval/answer_extracted": sum(1 for r in results if r.pred) / len(results),
        "eval/elapsed_s/mean": statistics.fmean(r.elapsed_s for r in results),
    }
    for stop, count in sorted(stops.items()):
        metrics[f"eval/stop/{stop}"] = count / len(results)
    for key in ("prompt_tokens", "completion_tokens"):
        values = [r.usage[key] for r in results if key in r.usage]
        if values:
            metrics[f"eval/{key}/mean"] = statistics.fmean(values)
    return metrics


def summarize(results: Iterable[SampleResult], n: int) -> dict[str, float]:
    results = list(results)
    return {**accuracy_metrics(results, n), **loop_metrics(results)}
