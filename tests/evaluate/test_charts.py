"""The pictures the demo and ``retool data check`` log: their numbers, and what the drawing shows."""

from __future__ import annotations

import io

import pytest

from retool.data_check.chart import DIFFERS, REPRODUCED, UNRECORDED, check_chart
from retool.data_check.check import CheckReport, StepReport, TrajectoryReport
from retool.data_check.compare import ERROR_MATCH, MATCH, MISMATCH, NOT_RECORDED, NUMERIC_MATCH
from retool.demo.timings import timings_chart
from retool.tracking.bar_chart import BarChart, Series, png_size, render_png


def trajectory(index: int, verdicts: list[str], truth: str | None = "42", pred: str | None = "42") -> TrajectoryReport:
    steps = [StepReport(step=i, verdict=v, similarity=1.0, sandbox_status="Success", elapsed_s=0.01) for i, v in enumerate(verdicts)]
    acc = None if truth is None else pred == truth
    return TrajectoryReport(index=index, question="q", steps=steps, ground_truth=truth, pred=pred, acc=acc)


def report(*trajectories: TrajectoryReport) -> CheckReport:
    return CheckReport(source="/data/sft/train.parquet", trajectories=list(trajectories))


def test_one_bar_per_trajectory_its_blocks_by_verdict_and_its_answer_named() -> None:
    chart = check_chart(
        report(
            trajectory(0, [MATCH, NUMERIC_MATCH, ERROR_MATCH]),
            trajectory(1, [MISMATCH, NOT_RECORDED], pred="41"),
            trajectory(2, [], truth=None),
            trajectory(3, [MATCH], pred=None),
        )
    )
    assert chart.title == "SFT data check: train.parquet"
    assert chart.categories == ("row 0 (right)", "row 1 (WRONG)", "row 2 (no truth)", "row 3 (no answer)")
    assert {s.label: s.values for s in chart.series} == {
        "reproduced": (3.0, 0.0, 0.0, 1.0),
        "differs": (0.0, 1.0, 0.0, 0.0),
        "not recorded": (0.0, 1.0, 0.0, 0.0),
    }
    assert chart.totals() == (3.0, 2.0, 0.0, 1.0)


def test_past_the_limit_trajectories_with_a_problem_are_shown_first_and_the_rest_counted() -> None:
    rows = [trajectory(i, [MATCH]) for i in range(6)]
    rows[4] = trajectory(4, [MISMATCH])
    rows[5] = trajectory(5, [MATCH], pred="7")
    chart = check_chart(report(*rows), max_bars=3)
    assert chart.categories == ("row 0 (right)", "row 4 (right)", "row 5 (WRONG)"), "the flagged rows, then the first others, in row order"
    assert chart.note.startswith("3 of 6 trajectories, 2 with a problem among them")


def pixels_near(png: bytes, colour: str, tolerance: int = 6) -> int:
    from PIL import Image

    target = tuple(int(colour[i : i + 2], 16) for i in (1, 3, 5))
    image = Image.open(io.BytesIO(png)).convert("RGB")
    return sum(1 for pixel in image.get_flattened_data() if all(abs(a - b) <= tolerance for a, b in zip(pixel, target, strict=True)))


def test_the_drawing_shows_a_red_segment_only_where_an_output_differs() -> None:
    clean = render_png(check_chart(report(trajectory(0, [MATCH, MATCH]), trajectory(1, [NOT_RECORDED]))))
    broken = render_png(check_chart(report(trajectory(0, [MATCH, MISMATCH]), trajectory(1, [NOT_RECORDED]))))
    assert pixels_near(clean, DIFFERS) == 0 and pixels_near(broken, DIFFERS) > 100
    assert pixels_near(clean, REPRODUCED) > pixels_near(broken, REPRODUCED) > 100, "one green block became red"
    assert pixels_near(clean, UNRECORDED) > 100


def test_a_chart_grows_with_its_bars_and_is_a_png() -> None:
    few = render_png(check_chart(report(*(trajectory(i, [MATCH]) for i in range(3)))))
    many = render_png(check_chart(report(*(trajectory(i, [MATCH]) for i in range(40)))))
    (few_width, few_height), (many_width, many_height) = png_size(few), png_size(many)
    assert few_width == many_width and many_height > few_height + 300
    with pytest.raises(ValueError, match="not a PNG"):
        png_size(b"GIF89a" + few[6:])


def test_the_timings_chart_keeps_the_steps_order_and_states_the_total() -> None:
    chart = timings_chart({"start_stack": 4.2, "prepare": 0.8, "data_check": 3.1, "train": 540.0})
    assert chart.categories == ("start_stack", "prepare", "data_check", "train")
    assert chart.totals() == (4.2, 0.8, 3.1, 540.0)
    assert chart.note == "548.1 s in all"


def test_a_series_of_the_wrong_length_is_refused() -> None:
    with pytest.raises(ValueError, match="series 'x' has 1 values for 2 categories"):
        BarChart(title="t", value_label="v", categories=("a", "b"), series=(Series("x", (1.0,), "#000000"),))
