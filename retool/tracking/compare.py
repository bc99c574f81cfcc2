"""``retool compare``: RetoolRuns side by side - final eval scores, RL validation curves and tool-use dynamics vs step.

The paper's headline is a comparison: ReTool reaches 67% on AIME 2024 after 400 RL steps, text-only
RL 40% after 1080. This module reads, for each RetoolRun (its MLflow parent run):

- the final scores of its eval stage (``eval/results.json`` of the latest eval attempt that logged
  one: what the operator copies into ``status.results``, ``mean@k``/``maj@k``/``best@k``/``pass@k``);
- the validation curves verl logs during RL. verl 0.6.1's ``RayPPOTrainer._validate`` puts the core
  variable's ``mean@n``, ``maj@n/mean`` and ``best@n/mean`` at the largest ``n`` under ``val-core/``
  (``verl/trainer/ppo/ray_trainer.py``, ``process_validation_metrics`` in ``metric_utils.py``); its
  MLflow logger writes ``@`` as ``_at_``. verl logs no ``pass@k`` while training;
- the tool-use dynamics (``tool/...``) and the reward watch's disagreement rate;

every rl attempt's history merged, the latest attempt winning at a step both logged. It tabulates
the eval scores with each run's last and best validation value and the step at which each run
first reached the baseline's best (the text-only run's when one is compared), and draws every run
on shared axes in one colour across all panels.

Pure: :func:`merge_attempts`, :func:`curve_keys`, :func:`score_table`, :func:`smooth`,
:func:`figure`, :func:`render_html`; the MLflow reads and writes are :func:`load_run_series`,
:func:`resolve_parent` and :func:`log_report`.
"""

from __future__ import annotations

import html
import io
import json
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from retool.tracking import naming
from retool.tracking._client import TrackingError, client, reported

VALIDATION_KEY = re.compile(r"^val-core/(?P<source>[^/]+)/(?P<var>[^/]+)/(?:(?P<mean>mean)_at_(?P<n>\d+)|(?P<stat>maj|best)_at_(?P<k>\d+)/mean)$")
"""The validation curves verl logs during RL, as MLflow stores them: ``val-core/aime_2024/acc/mean_at_16``, ``.../maj_at_16/mean``, ``.../best_at_16/mean``."""
DYNAMICS = {
    "tool/code_ratio": "share of responses with code",
    "tool/calls_per_response_mean": "interpreter calls per response",
    "tool/code_lines_per_call_mean": "code lines per call",
    "tool/first_call_position_mean": "first call position (0-1)",
    "tool/code_pass_rate_correct": "code pass rate (correct answers)",
    "tool/code_pass_rate_incorrect": "code pass rate (wrong answers)",
    "tool/response_length_correct_mean": "response tokens (correct)",
    "tool/response_length_incorrect_mean": "response tokens (wrong)",
    "val-tool/code_ratio": "share with code (validation)",
    "reward-watch/disagreement_rate": "second verifier disagreement",
}
"""Dynamics panels and their y-axis labels (docs/recipe.md, "Training dynamics")."""
DYNAMICS_KEYS = tuple(DYNAMICS)
RENAMED = {
    "tool/calls_per_response/mean": "tool/calls_per_response_mean",
    "tool/code_lines_per_call/mean": "tool/code_lines_per_call_mean",
    "tool/first_call_position/mean": "tool/first_call_position_mean",
    "tool/code_pass_rate/correct": "tool/code_pass_rate_correct",
    "tool/code_pass_rate/incorrect": "tool/code_pass_rate_incorrect",
    "tool/response_length/correct/mean": "tool/response_length_correct_mean",
    "tool/response_length/incorrect/mean": "tool/response_length_incorrect_mean",
}
"""Names runs recorded before the one-``/`` rule (``retool.recipe.dynamics``) logged, read as today's names,
so a comparison with an older run still shows its curves. (``first_call_position`` of such runs measured
where the first call ended; docs/recipe.md says how far apart the two readings are.)"""
STAT_ORDER = {"mean": 0, "maj": 1, "best": 2, "pass": 3}
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
"""One colour per run, in the order the runs are given, the same in every panel (the D3/matplotlib category10 colours)."""
TEXT_ONLY = "text-only"
REPORT_DIR = "compare"
_RUN_ID = re.compile(r"^[0-9a-f]{32}$")

Series = dict[int, float]


@dataclass
class RunSeries:
    """One RetoolRun: its histories (metric name -> {step: value}) and its eval stage's scores (source -> {mean@30: ..})."""

    label: str
    parent_run_id: str
    recipe: str
    metrics: dict[str, Series] = field(default_factory=dict)
    eval_results: dict[str, dict[str, float]] = field(default_factory=dict)
    eval_attempt: int | None = None
    cost: dict[str, float] = field(default_factory=dict)
    """The operator's ``cost/...`` figures on the parent run (their last values: the run's cost so far)."""


def merge_attempts(attempts: Sequence[Mapping[int, float]]) -> Series:
    """One history from the attempts' histories, oldest attempt first: a later attempt's value wins at a step both logged."""
    merged: Series = {}
    for history in attempts:
        merged.update({int(step): float(value) for step, value in history.items()})
    return dict(sorted(merged.items()))


def stat_of(key: str) -> tuple[str, str] | None:
    """(source, short name like ``maj@16``) of a validation curve key, None for any other key."""
    m = VALIDATION_KEY.match(key)
    if m is None:
        return None
    return m["source"], f"mean@{m['n']}" if m["mean"] else f"{m['stat']}@{m['k']}"


def _stat_order(source: str, stat: str) -> tuple[str, int, int]:
    kind, _, k = stat.partition("@")
    return (source, STAT_ORDER.get(kind, 9), int(k) if k.isdigit() else 0)


def curve_keys(runs: Sequence[RunSeries]) -> list[str]:
    """The validation curves any run logged, by source, then mean/maj/best, then k."""
    keys = {key for run in runs for key in run.metrics if stat_of(key)}
    return sorted(keys, key=lambda key: _stat_order(*stat_of(key)))  # type: ignore[misc]


def baseline_of(runs: Sequence[RunSeries]) -> RunSeries:
    """The text-only run when one is compared (the paper's baseline), else the first run given."""
    return next((run for run in runs if run.recipe == TEXT_ONLY), runs[0])


def first_step_reaching(series: Series, target: float) -> int | None:
    return next((step for step, value in sorted(series.items()) if value >= target), None)


def score_table(runs: Sequence[RunSeries], keys: Sequence[str]) -> list[dict[str, Any]]:
    """Per source, statistic and run: the eval stage's final score, the last and best validation value, and when it reached the baseline's best.

    Rows of the eval stage's statistics come first within a source (they are the run's results).
    The eval stage samples ``eval.samplesPerProblem`` answers per problem and validation
    ``rl``'s validation ``n``, so their statistics are usually at different k: each gets its rows.
    """
    if not runs:
        return []
    baseline = baseline_of(runs)
    curves = {stat_of(key): key for key in keys}
    stats = set(curves) | {(source, stat) for run in runs for source, scores in run.eval_results.items() for stat in scores}
    rows = []
    final = {(source, stat) for run in runs for source, scores in run.eval_results.items() for stat in scores}
    for source, stat in sorted(stats, key=lambda pair: (pair[0], pair not in final, *_stat_order(*pair)[1:])):
        key = curves.get((source, stat))
        base = baseline.metrics.get(key) if key else None
        target = max(base.values()) if base else None
        for run in runs:
            final = run.eval_results.get(source, {}).get(stat)
            series = run.metrics.get(key) or {} if key else {}
            if final is None and not series:
                continue
            last = max(series) if series else None
            best = max(series, key=lambda step: (series[step], -step)) if series else None
            rows.append(
                {
                    "source": source,
                    "stat": stat,
                    "run": run.label,
                    "recipe": run.recipe,
                    "eval": final,
                    "validation_last": None if last is None else series[last],
                    "validation_last_step": last,
                    "validation_best": None if best is None else series[best],
                    "validation_best_step": best,
                    "baseline": baseline.label,
                    "step_reaching_baseline_best": None if target is None or not series else first_step_reaching(series, target),
                }
            )
    return rows


TABLE_HEADER = ("source", "stat", "run", "recipe", "eval (final)", "validation last", "validation best", "reached baseline best at")


def _cells(r: Mapping[str, Any]) -> tuple[str, ...]:
    def at(value: float | None, step: int | None) -> str:
        return "-" if value is None else f"{value:.3f}@{step}"

    reached = r["step_reaching_baseline_best"]
    return (
        str(r["source"]),
        str(r["stat"]),
        str(r["run"]),
        str(r["recipe"]),
        "-" if r["eval"] is None else f"{r['eval']:.3f}",
        at(r["validation_last"], r["validation_last_step"]),
        at(r["validation_best"], r["validation_best_step"]),
        "-" if r["validation_last"] is None else ("never" if reached is None else f"step {reached}"),
    )


def _aligned(header: Sequence[str], lines: Sequence[Sequence[str]]) -> str:
    widths = [max(len(cell) for cell in column) for column in zip(header, *lines, strict=True)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() for line in [header, *lines])


def format_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The table as aligned text (what ``retool compare`` prints); ``value@step`` for validation."""
    return _aligned(TABLE_HEADER, [_cells(r) for r in rows])


COST_HEADER = ("run", "device-hours", "lost on failed attempts", "device-hours per eval point", "amount")


def cost_rows(runs: Sequence[RunSeries]) -> list[tuple[str, ...]]:
    """One row per run the operator logged a cost for (``cost/device_hours`` on its parent run; ``retool_operator.cost``)."""
    rows = []
    for run in runs:
        cost = run.cost
        if "cost/device_hours" not in cost:
            continue
        per_point = cost.get("cost/device_hours_per_point")
        amount = cost.get("cost/amount")
        rows.append((run.label, f"{cost['cost/device_hours']:g}", f"{cost.get('cost/lost_device_hours', 0.0):g}",
                     "-" if per_point is None else f"{per_point:g}", "-" if amount is None else f"{amount:.2f}"))
    return rows


def format_cost(runs: Sequence[RunSeries]) -> str:
    """The cost table as aligned text, or "" when no run has a cost (older runs, a CPU run)."""
    rows = cost_rows(runs)
    return _aligned(COST_HEADER, rows) if rows else ""


def smooth(series: Series, weight: float) -> Series:
    """TensorBoard's debiased exponential moving average over the logged points (``weight`` 0 = none, < 1)."""
    if not 0.0 <= weight < 1.0:
        raise ValueError(f"smoothing must be within [0, 1), got {weight}")
    out: Series = {}
    last = 0.0
    for count, (step, value) in enumerate(sorted(series.items()), start=1):
        last = last * weight + (1.0 - weight) * value
        out[step] = last / (1.0 - weight**count) if weight else value
    return out


@dataclass(frozen=True)
class Panel:
    key: str
    title: str
    y_label: str


def panels(runs: Sequence[RunSeries], keys: Sequence[str]) -> list[Panel]:
    """Validation curves, then the dynamics any run logged; each with its title and y-axis label."""
    out = []
    for key in keys:
        source, stat = stat_of(key)  # type: ignore[misc]
        out.append(Panel(key, f"{source} {stat} (RL validation)", f"{stat} accuracy"))
    out += [Panel(key, key, DYNAMICS[key]) for key in DYNAMICS_KEYS if any(run.metrics.get(key) for run in runs)]
    if not out:
        raise ValueError("none of the runs logged validation scores or tool-use dynamics yet")
    return out


def colours(runs: Sequence[RunSeries]) -> dict[str, str]:
    return {run.label: PALETTE[i % len(PALETTE)] for i, run in enumerate(runs)}


def figure(runs: Sequence[RunSeries], keys: Sequence[str], *, smoothing: float = 0.0) -> Any:
    """The plotly figure: one panel per curve, a legend entry per run that shows or hides it in every panel."""
    from plotly.subplots import make_subplots

    shown = panels(runs, keys)
    columns = min(2, len(shown))
    rows = -(-len(shown) // columns)
    fig = make_subplots(rows=rows, cols=columns, subplot_titles=[p.title for p in shown], vertical_spacing=min(0.3, 0.5 / rows), horizontal_spacing=0.1)
    colour = colours(runs)
    for run in runs:
        name = f"{run.label} ({run.recipe})"
        first = True
        for index, panel in enumerate(shown):
            series = run.metrics.get(panel.key) or {}
            if not series:
                continue
            row, col = index // columns + 1, index % columns + 1
            line = {"color": colour[run.label]}
            common = {"legendgroup": run.label, "name": name, "hovertemplate": f"{html.escape(name)}<br>step %{{x}}<br>{panel.y_label}: %{{y:.4g}}<extra></extra>"}
            if smoothing:
                fig.add_scatter(x=list(series), y=list(series.values()), mode="lines", line=line, opacity=0.3, showlegend=False, row=row, col=col, **common)
                series = smooth(series, smoothing)
            fig.add_scatter(x=list(series), y=list(series.values()), mode="lines+markers", marker={"size": 4}, line=line, showlegend=first, row=row, col=col, **common)
            first = False
    for index, panel in enumerate(shown):
        row, col = index // columns + 1, index % columns + 1
        fig.update_xaxes(title_text="training step", row=row, col=col)
        fig.update_yaxes(title_text=panel.y_label, row=row, col=col)
    fig.update_layout(height=330 * rows + 80, legend={"title": {"text": "runs (click to show/hide)"}}, template="plotly_white", margin={"t": 60})
    return fig


def plot_png(runs: Sequence[RunSeries], keys: Sequence[str], *, smoothing: float = 0.0) -> bytes:
    """The same panels as a PNG (what MLflow's artifact view previews), with the same colours."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = panels(runs, keys)
    columns = min(3, len(shown))
    rows = -(-len(shown) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(5.2 * columns, 3.4 * rows), squeeze=False)
    colour = colours(runs)
    for index, panel in enumerate(shown):
        ax = axes[index // columns][index % columns]
        for run in runs:
            series = run.metrics.get(panel.key) or {}
            if not series:
                continue
            if smoothing:
                ax.plot(list(series), list(series.values()), color=colour[run.label], alpha=0.3)
                series = smooth(series, smoothing)
            ax.plot(list(series), list(series.values()), color=colour[run.label], marker="o", markersize=3, label=f"{run.label} ({run.recipe})")
        ax.set_title(panel.title, fontsize=10)
        ax.set_xlabel("training step")
        ax.set_ylabel(panel.y_label, fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for index in range(len(shown), rows * columns):
        axes[index // columns][index % columns].axis("off")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    return buffer.getvalue()


def render_html(runs: Sequence[RunSeries], rows: Sequence[Mapping[str, Any]], plot: Any) -> str:
    """One self-contained page: the score table and the interactive plots (plotly.js inlined: hover, zoom, legend toggles)."""
    colour = colours(runs)
    body = "".join(f"<tr style='border-left:6px solid {colour.get(r['run'], '#000')}'>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in _cells(r)) + "</tr>" for r in rows)
    names = ", ".join(f"<span style='color:{colour[run.label]}'>&#9632;</span> {html.escape(f'{run.label} ({run.recipe})')}" for run in runs)
    plots = plot.to_html(full_html=False, include_plotlyjs=True, div_id="curves", config={"displaylogo": False, "responsive": True})
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>ReTool run comparison</title>"
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px}"
        "th{background:#f3f3f3}</style></head><body>"
        f"<h1>ReTool run comparison</h1><p>Runs: {names}. Baseline for \u201creached baseline best\u201d: "
        f"{html.escape(baseline_of(runs).label)}. Eval (final): the eval stage's scores (status.results); "
        "validation: verl's RL validation rounds, <code>value@step</code>.</p>"
        f"<table id='scores'><tr>{''.join(f'<th>{html.escape(h)}</th>' for h in TABLE_HEADER)}</tr>{body}</table>"
        f"{_cost_html(runs)}"
        f"<h2>RL validation and tool-use dynamics vs step</h2>{plots}"
        "</body></html>"
    )


def _cost_html(runs: Sequence[RunSeries]) -> str:
    rows = cost_rows(runs)
    if not rows:
        return ""
    body = "".join("<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in rows)
    return (
        "<h2>What each run cost</h2><p>Device-hours from the stage pods' scheduled-to-terminated times, every attempt "
        f"(the operator's status.cost).</p><table id='cost'><tr>{''.join(f'<th>{html.escape(h)}</th>' for h in COST_HEADER)}</tr>{body}</table>"
    )


# -- MLflow ---------------------------------------------------------------------------------------


def resolve_parent(tracking_uri: str, ref: str) -> Any:
    """The parent run of ``ref``: an MLflow run id (a parent, or a stage run of one), or a RetoolRun name (``name`` or ``namespace/name``)."""
    mlflow_client = client(tracking_uri)
    with reported(tracking_uri, f"finding the run {ref!r}"):
        if _RUN_ID.match(ref):
            run = mlflow_client.get_run(ref)
            parent_id = run.data.tags.get(naming.PARENT_RUN_ID_TAG)
            if run.data.tags.get(naming.TAG_ROLE) == naming.ROLE_STAGE and parent_id:
                return mlflow_client.get_run(parent_id)
            return run
        namespace, _, name = ref.rpartition("/")
        clauses = [f"tags.`{naming.TAG_ROLE}` = {naming.quote(naming.ROLE_PARENT)}", f"tags.`{naming.TAG_NAME}` = {naming.quote(name)}"]
        if namespace:
            clauses.append(f"tags.`{naming.TAG_NAMESPACE}` = {naming.quote(namespace)}")
        experiments = [e.experiment_id for e in mlflow_client.search_experiments()]
        found = mlflow_client.search_runs(experiments, filter_string=" and ".join(clauses), order_by=["attributes.start_time DESC"], max_results=10)
    if not found:
        raise TrackingError(f"MLflow at {tracking_uri}: no RetoolRun named {ref!r} (give its name, namespace/name, or an MLflow run id)")
    if len({(r.data.tags.get(naming.TAG_NAMESPACE), r.data.tags.get(naming.TAG_UID)) for r in found}) > 1 and not namespace:
        spaces = sorted({r.data.tags.get(naming.TAG_NAMESPACE, "?") for r in found})
        raise TrackingError(f"{ref!r} names RetoolRuns in several namespaces ({', '.join(spaces)}): give namespace/name")
    return found[0]


def load_run_series(tracking_uri: str, parent: Any) -> RunSeries:
    """A parent run's curves (every rl attempt, the latest winning at a step) and its eval stage's final scores (the latest attempt that logged them)."""
    from retool.tracking.evaluation import RESULTS_ARTIFACT

    mlflow_client = client(tracking_uri)
    parent_id = parent.info.run_id
    with reported(tracking_uri, f"reading the stage runs of {parent_id}"):
        stages = mlflow_client.search_runs([parent.info.experiment_id], filter_string=f"tags.`{naming.PARENT_RUN_ID_TAG}` = {naming.quote(parent_id)}", max_results=1000)

        def attempts(stage: str) -> list[Any]:
            return sorted((r for r in stages if r.data.tags.get(naming.TAG_STAGE) == stage), key=lambda r: int(r.data.tags.get(naming.TAG_ATTEMPT, "0")))

        rl = attempts("rl")
        keys = sorted({key for r in rl for key in r.data.metrics if stat_of(key) or key in DYNAMICS or key in RENAMED})
        metrics = {}
        for key in keys:
            histories = [{m.step: m.value for m in mlflow_client.get_metric_history(r.info.run_id, key)} for r in rl if key in r.data.metrics]
            metrics.setdefault(RENAMED.get(key, key), merge_attempts(histories))
        eval_results: dict[str, dict[str, float]] = {}
        eval_attempt = None
        for run in reversed(attempts("eval")):
            if any(a.path == RESULTS_ARTIFACT for a in mlflow_client.list_artifacts(run.info.run_id, RESULTS_ARTIFACT.rpartition("/")[0])):
                with tempfile.TemporaryDirectory() as tmp:
                    eval_results = json.loads(Path(mlflow_client.download_artifacts(run.info.run_id, RESULTS_ARTIFACT, tmp)).read_text())
                eval_attempt = int(run.data.tags.get(naming.TAG_ATTEMPT, "0"))
                break
    tags = parent.data.tags
    label = tags.get(naming.TAG_NAME) or parent.info.run_name or parent_id
    return RunSeries(
        label=label,
        parent_run_id=parent_id,
        recipe=parent.data.params.get("recipe", "tool-integrated"),
        metrics=metrics,
        eval_results=eval_results,
        eval_attempt=eval_attempt,
        cost={key: float(value) for key, value in parent.data.metrics.items() if key.startswith("cost/")},
    )


@dataclass(frozen=True)
class Report:
    table: list[dict[str, Any]]
    text: str
    png: bytes
    html: str


def build_report(runs: Sequence[RunSeries], *, smoothing: float = 0.0) -> Report:
    if not runs:
        raise ValueError("give at least one run")
    if not 0.0 <= smoothing < 1.0:
        raise ValueError(f"--smooth must be within [0, 1), got {smoothing}")
    labels = [run.label for run in runs]
    if len(set(labels)) != len(labels):
        for run in runs:  # same RetoolRun name in two namespaces: tell them apart
            run.label = f"{run.label}@{run.parent_run_id[:8]}"
    keys = curve_keys(runs)
    table = score_table(runs, keys)
    png = plot_png(runs, keys, smoothing=smoothing)
    text = format_table(table) + (f"\n\n{format_cost(runs)}" if cost_rows(runs) else "")
    return Report(table=table, text=text, png=png, html=render_html(runs, table, figure(runs, keys, smoothing=smoothing)))


def report_name(runs: Sequence[RunSeries]) -> str:
    return "-vs-".join(re.sub(r"[^A-Za-z0-9._-]", "_", run.label) for run in runs)[:200]


def log_report(tracking_uri: str, runs: Sequence[RunSeries], report: Report) -> str:
    """Store the report under ``compare/<run-vs-run>/`` of every compared parent run; returns that directory."""
    directory = f"{REPORT_DIR}/{report_name(runs)}"
    mlflow_client = client(tracking_uri)
    with tempfile.TemporaryDirectory() as tmp, reported(tracking_uri, "logging the comparison report"):
        files = write_report(report, Path(tmp))
        for run in runs:
            for path in files:
                mlflow_client.log_artifact(run.parent_run_id, str(path), directory)
    return directory


def write_report(report: Report, out: Path) -> list[Path]:
    """``report.png``, ``report.html`` and ``table.json`` under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    files = [out / "report.png", out / "report.html", out / "table.json"]
    files[0].write_bytes(report.png)
    files[1].write_text(report.html, encoding="utf-8")
    files[2].write_text(json.dumps(report.table, indent=2), encoding="utf-8")
    return files
