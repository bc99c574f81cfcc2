"""What a finished rehearsal shows, read back from MLflow (where the stages logged it) and said in a few lines."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from retool.rehearsal.pipeline import Rehearsal
from retool.tracking import naming
from retool.tracking._client import client

RL_KEYS = ("tool/calls", "tool/outcome_success_count", "critic/score/mean", "critic/score/max", "actor/grad_norm")


@dataclass
class RehearsalSummary:
    parent_url: str
    seconds: dict[str, float]
    peak_gb: dict[str, float] = field(default_factory=dict)
    """The most memory any attempt of the stage held at once (all its processes)."""
    sft_loss: tuple[float, float] | None = None
    """(first step, last step)."""
    sft_steps: int = 0
    rl: dict[int, dict[str, float]] = field(default_factory=dict)
    """step -> the RL figures of :data:`RL_KEYS`."""
    scores: dict[str, float] = field(default_factory=dict)
    """The parent run's ``final/<set>_mean_at_<k>``."""


def _stage_runs(mlflow_client: Any, rehearsal: Rehearsal, stage: str) -> list[Any]:
    runs = mlflow_client.search_runs(
        [rehearsal.parent.experiment_id],
        filter_string=f"tags.`{naming.PARENT_RUN_ID_TAG}` = {naming.quote(rehearsal.parent.run_id)} and tags.`{naming.TAG_STAGE}` = {naming.quote(stage)}",
    )
    return sorted(runs, key=lambda run: int(run.data.tags.get(naming.TAG_ATTEMPT, "0")))


def _history(mlflow_client: Any, runs: list[Any], key: str) -> dict[int, float]:
    """``key`` over every attempt of a stage, a later attempt's value winning at a step both logged."""
    merged: dict[int, float] = {}
    for run in runs:
        merged.update({m.step: m.value for m in mlflow_client.get_metric_history(run.info.run_id, key)})
    return merged


def summarize(rehearsal: Rehearsal) -> RehearsalSummary:
    mlflow_client = client(rehearsal.config.mlflow_uri)
    seconds: dict[str, float] = {}
    peak: dict[str, float] = {}
    for attempt in rehearsal.attempts:
        seconds[attempt.stage] = round(seconds.get(attempt.stage, 0.0) + attempt.seconds, 1)
        peak[attempt.stage] = round(max(peak.get(attempt.stage, 0.0), attempt.peak_rss_mb / 1024), 1)
    summary = RehearsalSummary(parent_url=rehearsal.parent.url, seconds=seconds, peak_gb=peak)
    loss = _history(mlflow_client, _stage_runs(mlflow_client, rehearsal, "sft"), "train/loss")
    if loss:
        summary.sft_loss = (loss[min(loss)], loss[max(loss)])
        summary.sft_steps = max(loss)
    rl_runs = _stage_runs(mlflow_client, rehearsal, "rl")
    for key in RL_KEYS:
        for step, value in _history(mlflow_client, rl_runs, key).items():
            summary.rl.setdefault(step, {})[key] = value
    parent = mlflow_client.get_run(rehearsal.parent.run_id).data.metrics
    summary.scores = {key.removeprefix("final/"): value for key, value in sorted(parent.items()) if key.startswith("final/") and "_mean_at_" in key}
    return summary


def summary_lines(summary: RehearsalSummary) -> list[str]:
    lines = []
    if summary.sft_loss:
        lines.append(f"  sft          loss {summary.sft_loss[0]:.2f} -> {summary.sft_loss[1]:.3f} over {summary.sft_steps} steps")
    for step, figures in sorted(summary.rl.items()):
        lines.append(
            f"  rl step {step}    {figures.get('tool/calls', 0):.0f} tool calls ({figures.get('tool/outcome_success_count', 0):.0f} ran), "
            f"reward mean {figures.get('critic/score/mean', float('nan')):+.2f} (max {figures.get('critic/score/max', float('nan')):+.0f}), "
            f"grad norm {figures.get('actor/grad_norm', float('nan')):.3f}"
        )
    if summary.scores:
        lines.append("  eval         " + ", ".join(f"{name.replace('_mean_at_', ' mean@')} {value:.2f}" for name, value in summary.scores.items()))
    lines.append(f"  stages       {', '.join(f'{stage} {seconds:.0f}s' for stage, seconds in summary.seconds.items())}")
    if summary.peak_gb:
        lines.append(f"  peak memory  {', '.join(f'{stage} {gb:.1f} GB' for stage, gb in summary.peak_gb.items())}")
    lines.append(f"  MLflow run   {summary.parent_url}")
    return lines
