"""Stacked horizontal bar charts as PNG files: what MLflow's artifact view previews (issue 50's pictures).

A chart is its numbers first (:class:`BarChart`, built by pure functions that tests read) and a
drawing second (:func:`render_png`, matplotlib's Agg backend: no display, the same on a laptop and in a
pod). One bar per category, top to bottom in the order given; each series is a segment of every bar.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@dataclass(frozen=True)
class Series:
    label: str
    values: tuple[float, ...]
    """One value per category, in the chart's category order."""
    colour: str


@dataclass(frozen=True)
class BarChart:
    title: str
    value_label: str
    categories: tuple[str, ...]
    series: tuple[Series, ...]
    note: str = ""
    """A line under the title (what was left out, what a colour means)."""

    def __post_init__(self) -> None:
        for series in self.series:
            if len(series.values) != len(self.categories):
                raise ValueError(f"series {series.label!r} has {len(series.values)} values for {len(self.categories)} categories")

    def totals(self) -> tuple[float, ...]:
        """Each bar's length (the sum of its segments)."""
        return tuple(sum(values) for values in zip(*(s.values for s in self.series), strict=True)) if self.series else tuple(0.0 for _ in self.categories)


def render_png(chart: BarChart) -> bytes:
    """The chart drawn: bars top to bottom in category order, each bar's total written at its end."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    count = max(1, len(chart.categories))
    fig, ax = plt.subplots(figsize=(9.0, 1.4 + 0.32 * count))
    positions = list(range(len(chart.categories)))
    left = [0.0] * len(chart.categories)
    for series in chart.series:
        shown = any(series.values)  # a legend entry only for what the bars hold: no red swatch on a clean check
        ax.barh(positions, series.values, left=left, color=series.colour, label=series.label if shown else "_nolegend_", height=0.7)
        left = [a + b for a, b in zip(left, series.values, strict=True)]
    for position, total in zip(positions, chart.totals(), strict=True):
        ax.text(total, position, f" {total:g}", va="center", fontsize=8)
    ax.set_yticks(positions, labels=list(chart.categories), fontsize=8)
    ax.invert_yaxis()  # the first category on top, as it reads in a table
    ax.set_xlabel(chart.value_label)
    ax.set_title(chart.title + (f"\n{chart.note}" if chart.note else ""), fontsize=10)
    ax.set_xlim(0, max(chart.totals(), default=0.0) * 1.12 or 1.0)  # room for the totals written at the bars' ends
    ax.grid(axis="x", alpha=0.3)
    if all(float(v).is_integer() for s in chart.series for v in s.values):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if len(chart.series) > 1:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the bars, never over them
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    return buffer.getvalue()


def write_png(chart: BarChart, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(render_png(chart))
    return path


def png_size(data: bytes) -> tuple[int, int]:
    """Width and height from a PNG's header (its IHDR chunk), refusing anything that is not a PNG."""
    if not data.startswith(PNG_SIGNATURE) or data[12:16] != b"IHDR":
        raise ValueError("not a PNG file")
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
