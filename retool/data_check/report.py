"""The check report on disk: a JSON file with every block, and a Markdown page for people."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from retool.data_check.chart import write_check_chart
from retool.data_check.check import CheckReport


def report_json(report: CheckReport) -> dict:
    return {
        "source": report.source,
        "ok": report.ok,
        "metrics": report.metrics(),
        "problems": report.problems(),
        "unreadable": report.unreadable,
        "trajectories": [asdict(t) | {"all_agree": t.all_agree} for t in report.trajectories],
    }


def report_markdown(report: CheckReport, max_problems: int = 50) -> str:
    metrics = report.metrics()
    lines = [
        f"# SFT data check: {report.source}",
        "",
        f"Verdict: **{'OK' if report.ok else 'PROBLEMS FOUND'}**",
        "",
        "| figure | value |",
        "|---|---|",
    ]
    for key, value in metrics.items():
        shown = f"{value:.3f}" if isinstance(value, float) and not value.is_integer() else f"{value:g}"
        lines.append(f"| `{key.removeprefix('data_check/')}` | {shown} |")
    lines += ["", "## Trajectories", "", "| row | blocks | agreeing | answer | expected | correct |", "|---|---|---|---|---|---|"]
    for t in report.trajectories:
        agreeing = sum(1 for s in t.steps if s.verdict in {"match", "numeric_match", "error_match"})
        correct = "-" if t.acc is None else ("yes" if t.acc else "NO")
        lines.append(f"| {t.index} | {len(t.steps)} | {agreeing} | {t.pred or '-'} | {t.ground_truth or '-'} | {correct} |")
    problems = report.problems()
    lines += ["", "## Problems", ""]
    lines += [f"- {p}" for p in problems[:max_problems]] or ["None."]
    if len(problems) > max_problems:
        lines.append(f"- ... and {len(problems) - max_problems} more (see the JSON report)")
    diffs = [(t.index, s) for t in report.trajectories for s in t.steps if s.diff]
    if diffs:
        lines += ["", "## Differences", ""]
        for index, step in diffs[:10]:
            lines += [f"row {index} block {step.step}:", "", "```diff", step.diff, "```", ""]
    return "\n".join(lines) + "\n"


def write_report(report: CheckReport, out_dir: Path) -> tuple[Path, Path]:
    """``report.json``, ``report.md`` and the chart (``blocks.png``, :mod:`retool.data_check.chart`) in
    ``out_dir``; returns the first two paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / "report.json", out_dir / "report.md"
    json_path.write_text(json.dumps(report_json(report), indent=2, ensure_ascii=False) + "\n")
    md_path.write_text(report_markdown(report))
    write_check_chart(report, out_dir)
    return json_path, md_path
