"""The demo's step timings as a picture (``charts/timings.png`` on the demo's MLflow run).

Where a demo's minutes went, one bar per step in the order the steps ran: the figures
``demo/seconds/<step>`` hold the same numbers, but a newcomer asking "why was that slow?" looks.
"""

from __future__ import annotations

from collections.abc import Mapping

from retool.tracking.bar_chart import BarChart, Series

CHART_PATH = "charts/timings.png"
STEP_COLOUR = "#1f77b4"


def timings_chart(seconds: Mapping[str, float]) -> BarChart:
    """One bar per step, in the order the steps ran (``seconds`` keeps it), and the total in the note."""
    return BarChart(
        title="Where the demo's time went",
        value_label="seconds",
        categories=tuple(seconds),
        series=(Series("seconds", tuple(float(v) for v in seconds.values()), STEP_COLOUR),),
        note=f"{sum(seconds.values()):.1f} s in all",
    )
