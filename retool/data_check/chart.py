"""The data check as a picture: one bar per trajectory, its code blocks by the sandbox's verdict.

A data owner reads it at a glance in MLflow (the check's report directory is logged as an artifact):
green blocks reproduced their recorded output, red ones did not, grey ones had none recorded; the
label says whether the trajectory's final answer was right. Past ``MAX_BARS`` trajectories, those with
a problem come first and the rest fill up to the limit, and the note says how many were left out.
"""

from __future__ import annotations

import logging
from pathlib import Path

from retool.data_check.check import CheckReport, TrajectoryReport
from retool.data_check.compare import AGREEING, MISMATCH, NOT_RECORDED
from retool.tracking.bar_chart import BarChart, Series, write_png

logger = logging.getLogger(__name__)

MAX_BARS = 60
"""Bars one picture holds readably (about 20 px each)."""
CHART_FILE = "blocks.png"
REPRODUCED, DIFFERS, UNRECORDED = "#2ca02c", "#d62728", "#9e9e9e"


def _answer(trajectory: TrajectoryReport) -> str:
    if trajectory.acc is None:
        return "no truth" if trajectory.pred else "no answer, no truth"
    if not trajectory.pred:
        return "no answer"
    return "right" if trajectory.acc else "WRONG"


def _has_problem(trajectory: TrajectoryReport) -> bool:
    return not trajectory.all_agree or trajectory.acc is False or (trajectory.ground_truth is not None and not trajectory.pred)


def check_chart(report: CheckReport, max_bars: int = MAX_BARS) -> BarChart:
    """The chart's numbers: per trajectory shown, its blocks reproduced, differing and unrecorded."""
    trajectories = report.trajectories
    shown = trajectories
    note = "green: output reproduced · red: output differs · grey: no output recorded"
    if len(trajectories) > max_bars:
        flagged = [t for t in trajectories if _has_problem(t)]
        rest = [t for t in trajectories if not _has_problem(t)]
        shown = sorted((flagged + rest)[:max_bars], key=lambda t: t.index)
        note = f"{max_bars} of {len(trajectories)} trajectories, {min(len(flagged), max_bars)} with a problem among them · " + note
    counts = [(sum(s.verdict in AGREEING for s in t.steps), sum(s.verdict == MISMATCH for s in t.steps), sum(s.verdict == NOT_RECORDED for s in t.steps)) for t in shown]
    return BarChart(
        title=f"SFT data check: {Path(report.source).name}",
        value_label="code blocks re-run in the sandbox",
        categories=tuple(f"row {t.index} ({_answer(t)})" for t in shown),
        series=(
            Series("reproduced", tuple(float(c[0]) for c in counts), REPRODUCED),
            Series("differs", tuple(float(c[1]) for c in counts), DIFFERS),
            Series("not recorded", tuple(float(c[2]) for c in counts), UNRECORDED),
        ),
        note=note,
    )


def write_check_chart(report: CheckReport, out_dir: Path) -> Path | None:
    """``blocks.png`` in ``out_dir``; None (and a warning) where matplotlib is not installed (the
    ``train`` extra brings it) or there is no trajectory to draw."""
    if not report.trajectories:
        return None
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        logger.warning("no %s: matplotlib is not installed (pip install 'retool[train]')", CHART_FILE)
        return None
    return write_png(check_chart(report), out_dir / CHART_FILE)
