"""``retool compare``: RetoolRuns side by side - AIME scores and tool-use dynamics vs step, and who got where first.

The paper's headline is a comparison: ReTool reaches 67% on AIME 2024 after 400 RL steps, text-only
RL 40% after 1080. This module reads, for each RetoolRun (its MLflow parent run), the metric
histories its rl stage runs logged (every attempt; a later attempt's value wins at a step it
repeats), then draws every run on shared axes and tabulates the final scores with the step at which
each run first reached the baseline's best (the text-only run's when one is compared).

Pure: :func:`merge_attempts`, :func:`score_keys`, :func:`score_table`, :func:`render_html`; the
MLflow reads and writes are :func:`load_run_series`, :func:`resolve_parent` and :func:`log_report`.
"""

from __future__ import annotations

import base64
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

SCORE_KEY = re.compile(r"^val-core/(?P<source>[^/]+)/acc/(?P<kind>mean|pass)_at_(?P<k>\d+)$")
"""The AIME metrics of validation rounds (and the eval stage) as MLflow stores verl's names."""
DYNAMICS_KEYS = (
    "tool/code_ratio",
    "tool/calls_per_response/mean",
    "tool/code_lines_per_call/mean",
    "tool/first_call_position/mean",
    "tool/code_pass_rate/correct",
    "tool/code_pass_rate/incorrect",
    "tool/response_length/correct/mean",
    "tool/response_length/incorrect/mean",
    "val-tool/code_ratio",
    "reward-watch/disagreement_rate",
)
TEXT_ONLY = "text-only"
REPORT_DIR = "compare"
_RUN_ID = re.compile(r"^[0-9a-f]{32}$")

Series = dict[int, float]


@dataclass
class RunSeries:
    """One RetoolRun's histories: metric name -> {step: value}."""

    label: str
    parent_run_id: str
    recipe: str
    metrics: dict[str, Series] = field(default_factory=dict)


def merge_attempts(attempts: Sequence[Mapping[int, float]]) -> Series:
    """One history from the attempts' histories, oldest attempt first: a later attempt's value wins at a step both logged."""
    merged: Series = {}
    for history in attempts:
        merged.update({int(step): float(value) for step, value in history.items()})
    return dict(sorted(merged.items()))


def score_keys(runs: Sequence[RunSeries]) -> list[str]:
    """The AIME metrics any run logged, mean before pass, by source and k."""
    keys = {key for run in runs for key in run.metrics if SCORE_KEY.match(key)}

    def order(key: str) -> tuple[str, int, int]:
        m = SCORE_KEY.match(key)
        assert m is not None
        return (m["source"], 0 if m["kind"] == "mean" else 1, int(m["k"]))

    return sorted(keys, key=order)


def baseline_of(runs: Sequence[RunSeries]) -> RunSeries:
    """The text-only run when one is compared (the paper's baseline), else the first run given."""
    return next((run for run in runs if run.recipe == TEXT_ONLY), runs[0])


def first_step_reaching(series: Series, target: float) -> int | None:
    return next((step for step, value in sorted(series.items()) if value >= target), None)


def score_table(runs: Sequence[RunSeries], keys: Sequence[str]) -> list[dict[str, Any]]:
    """Per run and AIME metric: the final and best value, and the first step at which it reached the baseline's best."""
    if not runs:
        return []
    baseline = baseline_of(runs)
    rows = []
    for key in keys:
        base = baseline.metrics.get(key) or {}
        target = max(base.values()) if base else None
        for run in runs:
            series = run.metrics.get(key) or {}
            if not series:
                continue
            last_step = max(series)
            rows.append(
                {
                    "metric": key,
                    "run": run.label,
                    "recipe": run.recipe,
                    "final": series[last_step],
                    "final_step": last_step,
                    "best": max(series.values()),
                    "baseline": baseline.label,
                    "step_reaching_baseline_best": None if target is None else first_step_reaching(series, target),
                }
            )
    return rows


def format_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The table as aligned text (what ``retool compare`` prints)."""
    header = ("metric", "run", "recipe", "final", "at step", "best", "reached baseline best at")
    lines = [
        (
            str(r["metric"]).removeprefix("val-core/"),
            str(r["run"]),
            str(r["recipe"]),
            f"{r['final']:.3f}",
            str(r["final_step"]),
            f"{r['best']:.3f}",
            "never" if r["step_reaching_baseline_best"] is None else f"step {r['step_reaching_baseline_best']}",
        )
        for r in rows
    ]
    widths = [max(len(cell) for cell in column) for column in zip(header, *lines, strict=True)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() for line in [header, *lines])


def plot_report(runs: Sequence[RunSeries], keys: Sequence[str]) -> bytes:
    """A PNG: one panel per AIME metric and per dynamics metric any run logged, every run on the panel's shared axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [*keys, *(key for key in DYNAMICS_KEYS if any(run.metrics.get(key) for run in runs))]
    if not panels:
        raise ValueError("none of the runs logged AIME scores or tool-use dynamics yet")
    columns = min(3, len(panels))
    rows = -(-len(panels) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(5.2 * columns, 3.4 * rows), squeeze=False)
    steps = [step for run in runs for key in panels for step in run.metrics.get(key, {})]
    for index, key in enumerate(panels):
        ax = axes[index // columns][index % columns]
        for run in runs:
            series = run.metrics.get(key) or {}
            if series:
                ax.plot(list(series), list(series.values()), marker="o", markersize=3, label=f"{run.label} ({run.recipe})")
        ax.set_title(key.replace("_at_", "@"), fontsize=10)
        ax.set_xlabel("step")
        if steps:
            ax.set_xlim(min(steps), max(steps) + max(1, (max(steps) - min(steps)) * 0.03))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for index in range(len(panels), rows * columns):
        axes[index // columns][index % columns].axis("off")
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110)
    plt.close(figure)
    return buffer.getvalue()


def render_html(runs: Sequence[RunSeries], rows: Sequence[Mapping[str, Any]], png: bytes) -> str:
    """A self-contained page (the plot inlined as data), so it opens from an MLflow artifact or a file alone."""
    head = ["metric", "run", "recipe", "final", "at step", "best", "reached baseline best at"]
    body = "".join(
        "<tr>"
        + "".join(
            f"<td>{html.escape(str(cell))}</td>"
            for cell in (
                r["metric"],
                r["run"],
                r["recipe"],
                f"{r['final']:.3f}",
                r["final_step"],
                f"{r['best']:.3f}",
                "never" if r["step_reaching_baseline_best"] is None else f"step {r['step_reaching_baseline_best']}",
            )
        )
        + "</tr>"
        for r in rows
    )
    names = ", ".join(html.escape(f"{run.label} ({run.recipe})") for run in runs)
    image = base64.b64encode(png).decode("ascii")
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>ReTool run comparison</title>"
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px}"
        "th{background:#f3f3f3}img{max-width:100%}</style></head><body>"
        f"<h1>ReTool run comparison</h1><p>Runs: {names}. Baseline for \u201creached baseline best\u201d: "
        f"{html.escape(baseline_of(runs).label)}.</p>"
        f"<table id='scores'><tr>{''.join(f'<th>{h}</th>' for h in head)}</tr>{body}</table>"
        f"<h2>AIME scores and tool-use dynamics vs step</h2><img id='plots' alt='AIME scores and tool-use dynamics vs step' src='data:image/png;base64,{image}'>"
        "</body></html>"
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
    """The AIME and dynamics histories of a parent run's rl stage attempts (and its eval stage's final scores)."""
    mlflow_client = client(tracking_uri)
    parent_id = parent.info.run_id
    with reported(tracking_uri, f"reading the stage runs of {parent_id}"):
        stages = mlflow_client.search_runs(
            [parent.info.experiment_id], filter_string=f"tags.`{naming.PARENT_RUN_ID_TAG}` = {naming.quote(parent_id)}", max_results=1000
        )
        rl = sorted((r for r in stages if r.data.tags.get(naming.TAG_STAGE) == "rl"), key=lambda r: int(r.data.tags.get(naming.TAG_ATTEMPT, "0")))
        keys = sorted({key for r in rl for key in r.data.metrics if SCORE_KEY.match(key) or key in DYNAMICS_KEYS})
        metrics = {}
        for key in keys:
            attempts = [{m.step: m.value for m in mlflow_client.get_metric_history(r.info.run_id, key)} for r in rl if key in r.data.metrics]
            metrics[key] = merge_attempts(attempts)
    tags = parent.data.tags
    label = tags.get(naming.TAG_NAME) or parent.info.run_name or parent_id
    return RunSeries(label=label, parent_run_id=parent_id, recipe=parent.data.params.get("recipe", "tool-integrated"), metrics=metrics)


@dataclass(frozen=True)
class Report:
    table: list[dict[str, Any]]
    text: str
    png: bytes
    html: str


def build_report(runs: Sequence[RunSeries]) -> Report:
    if not runs:
        raise ValueError("give at least one run")
    labels = [run.label for run in runs]
    if len(set(labels)) != len(labels):
        for run in runs:  # same RetoolRun name in two namespaces: tell them apart
            run.label = f"{run.label}@{run.parent_run_id[:8]}"
    keys = score_keys(runs)
    table = score_table(runs, keys)
    png = plot_report(runs, keys)
    return Report(table=table, text=format_table(table), png=png, html=render_html(runs, table, png))


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
