"""The eval summary: verl-named accuracy metrics and loop statistics from per-sample results."""

from __future__ import annotations

import pytest

from retool.evaluate.results import SampleResult, read_results, summarize


def sample(problem, k, acc, pred, *, turns=2, calls=1, failures=0, stop="answered", source="aime_2024", error=None):
    return SampleResult(
        problem_index=problem,
        sample_index=k,
        data_source=source,
        ground_truth="1",
        pred=pred,
        score=1.0 if acc else -1.0,
        acc=acc,
        turns=turns,
        tool_calls=calls,
        tool_failures=failures,
        stop=stop,
        elapsed_s=1.0,
        usage={"prompt_tokens": 10, "completion_tokens": 4},
        error=error,
    )


RESULTS = [
    # problem 0: both samples correct; problem 1: one of two correct
    sample(0, 0, True, "1"),
    sample(0, 1, True, "1", turns=4, calls=3, failures=1),
    sample(1, 0, False, "7", turns=1, calls=0),
    sample(1, 1, True, "1", turns=8, calls=8, stop="max_turns"),
]


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("val-core/aime_2024/acc/mean@2", 0.75),
        ("val-core/aime_2024/acc/pass@2", 1.0),
        ("val-aux/aime_2024/acc/pass@1", 0.75),
        ("eval/samples", 4.0),
        ("eval/turns_mean", 15 / 4),
        ("eval/turns_max", 8.0),
        ("eval/tool_calls_total", 12.0),
        ("eval/tool_calls_mean", 3.0),
        ("eval/tool_calls_failure_rate", 1 / 12),
        ("eval/samples_with_tool_call", 0.75),
        ("eval/stop_answered", 0.75),
        ("eval/stop_max_turns", 0.25),
        ("eval/answer_extracted", 1.0),
        ("eval/errors", 0.0),
        ("eval/prompt_tokens_mean", 10.0),
    ],
    ids=lambda v: str(v),
)
def test_summary_figures(key, value):
    assert summarize(RESULTS)[key] == pytest.approx(value)


def test_summary_has_majority_and_best_of_n_per_source():
    summary = summarize([*RESULTS, sample(5, 0, False, "7", source="aime_2025")])
    assert {"val-core/aime_2024/acc/maj@2/mean", "val-core/aime_2024/acc/best@2/mean", "val-core/aime_2025/acc/mean@1"} <= summary.keys()
    assert summary["val-core/aime_2025/acc/mean@1"] == 0.0


def test_a_sample_that_failed_at_the_endpoint_is_counted_not_scored():
    failed = sample(5, 0, False, None, source="aime_2025", error="HTTP 500", turns=0, calls=0, stop="error")
    summary = summarize([*RESULTS, failed])
    assert summary["eval/errors"] == 1.0 and summary["eval/samples"] == len(RESULTS) + 1
    assert not [key for key in summary if "aime_2025" in key], "a source none of whose samples completed has no score"
    assert {k: v for k, v in summary.items() if k not in ("eval/samples", "eval/errors")} == {
        k: v for k, v in summarize(RESULTS).items() if k not in ("eval/samples", "eval/errors")
    }


def test_nothing_completed_is_no_figures_but_the_counts():
    failed = [sample(i, 0, False, None, error="connection refused", turns=0, calls=0, stop="error") for i in range(3)]
    assert summarize(failed) == {"eval/samples": 3.0, "eval/errors": 3.0}


def test_results_round_trip_through_jsonl(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text("".join(r.to_json() + "\n" for r in RESULTS))
    assert read_results(path) == RESULTS
