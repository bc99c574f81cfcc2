"""The reward watch's second verifier (math-verify) on the answer region the reward grades.

Measured against the labels of the reward's own case table (the reward matches every label, so any
verdict against a label is the verifier's own error, i.e. the benign disagreement a run shows while
its reward is right). The sets below are math-verify's known misses; docs/recipe.md records the
rates ("Second verifier: benign disagreement rate"), and the test checks that figure stays true.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import time
from pathlib import Path

import pytest

from retool.recipe.reward.score import MAX_TIMEOUT_S, compute_score
from retool.recipe.reward_watch import VERIFY_STEP_TIMEOUT_S, WatchSettings, answer_region, second_verdict
from retool.recipe.verl_plugins.watch import BatchWatcher, Sample
from retool.spec.model import RewardWatchSpec
from tests.recipe_reward.cases import ALL

DOC = Path(__file__).resolve().parents[2] / "docs" / "recipe.md"

# Correct answers math-verify does not credit even when handed the reward's extracted answer.
VERIFIER_FALSE_REJECTS = {
    "whitespace inside the box",
    "thin-space thousands separator",
    "scientific e notation",
    "choice letter with its value",
    "choice letter against the letter",
    "repeating decimal after fixed digits",
    "varnothing is the empty set",
    "empty braces are the empty set",
    "fraction against a percent truth",
    "speed in metres per second",
    "speed in kilometres per hour",
    "acceleration with a squared unit",
    "remark of text in parentheses",
    "one long word is a remark",
}
# Responses with no answer by the reward's rules, where math-verify's own extraction of the prose finds the truth.
VERIFIER_FALSE_ACCEPTS = {
    "a bare number in prose is not an answer",
    "a word ending in answer is not an answer",
    "a list marker is not a bare answer",
    "a number inside the last sentence is not bare",
}
# math-verify reads no value from the truth ("") or from the reward's answer (its parser keeps only the
# text: percent signs, unicode fractions and signs, repeating decimals, junk; or it gives up): no verdict.
VERIFIER_UNKNOWN = {
    "unicode degree sign",
    "en dash as minus",
    "percent sign",
    "trailing period in box",
    "percent of the wrong size",
    "repeating decimal",
    "repeating decimal is not its truncation",
    "percent equals the fraction it names",
    "unicode vulgar fraction",
    "mixed number with a vulgar fraction",
    "vulgar fraction of another value",
    "very long digit string",
    "deep nesting of braces",
    "long junk answer",
    "latex garbage",
    "answer line built to backtrack",
    "huge answer is only compared verbatim",
    "unclosed answer tags in long prose",
    "zero vs empty",
    # math-verify runs out of its 5 s on these (a tower, a huge power): no verdict, not "wrong"
    "power tower of nines",
    "power tower of tens",
    "huge literal exponent",
}


# The cases math-verify gets no verdict on in any time; the others are graded with a budget no busy
# machine runs out of, so that what is measured is math-verify's verdict, not the machine's load (its
# own 5 s, wall-clock, ran out on CI with a training run beside the suite).
TIMED_OUT = {"power tower of nines", "power tower of tens", "huge literal exponent", "deep nesting of braces", "huge answer is only compared verbatim"}
UNHURRIED_S = 120


@pytest.fixture(scope="module")
def verdicts() -> dict[str, str]:
    """Every case through a spawned process's main thread, as the watcher's verifier process grades a step's samples."""
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=2, mp_context=context) as pool:
        futures = {case.id: pool.submit(second_verdict, case.response, case.truth, VERIFY_STEP_TIMEOUT_S if case.id in TIMED_OUT else UNHURRIED_S) for case in ALL}
        return {case_id: future.result() for case_id, future in futures.items()}


def test_the_reward_matches_every_label_of_its_table() -> None:
    """The premise of the measurement: a verifier verdict against a label is the verifier's error, not the reward's.
    The reward's symbolic budget is its largest: labels are checked here, not speed under load."""
    assert [c.id for c in ALL if (compute_score("dapo_math", c.response, c.truth, timeout_s=MAX_TIMEOUT_S)["acc"] == 1.0) != c.correct] == []


def test_the_watchers_verifier_process_grades_as_second_verdict_does() -> None:
    """The watcher's own process (math-verify's SIGALRM needs a main thread) gives the verdicts the table measures."""
    cases = [c for c in ALL if c.id in {"last boxed wins over an earlier one", "thin-space thousands separator", "percent sign"}]
    watcher = BatchWatcher(tokenizer=None, response_length=1, settings=WatchSettings(share=1.0, max_per_step=len(cases)), use_mlflow=False)
    try:
        raw = watcher._verdicts([(case.response, case.truth) for case in cases])
    finally:
        watcher.close()
    assert raw == [{"correct": True, "wrong": False, "unknown": None}[second_verdict(c.response, c.truth)] for c in cases]
    assert raw == [True, False, None]


def test_the_verifiers_own_errors_on_the_case_table_are_exactly_the_known_ones(verdicts: dict[str, str]) -> None:
    labels = {c.id: c.correct for c in ALL}
    assert {k for k, v in verdicts.items() if v == "wrong" and labels[k]} == VERIFIER_FALSE_REJECTS
    assert {k for k, v in verdicts.items() if v == "correct" and not labels[k]} == VERIFIER_FALSE_ACCEPTS
    assert {k for k, v in verdicts.items() if v == "unknown"} == VERIFIER_UNKNOWN


def benign_rates() -> tuple[int, int, float, int, int, float]:
    labels = [c.correct for c in ALL]
    graded = len(ALL) - len(VERIFIER_UNKNOWN)
    errors = len(VERIFIER_FALSE_REJECTS) + len(VERIFIER_FALSE_ACCEPTS)
    correct_graded = sum(labels) - len({c.id for c in ALL if c.correct} & VERIFIER_UNKNOWN)
    return errors, graded, errors / graded, len(VERIFIER_FALSE_REJECTS), correct_graded, len(VERIFIER_FALSE_REJECTS) / correct_graded


def test_docs_state_the_measured_benign_disagreement_rate_next_to_the_default_benign_rate() -> None:
    errors, graded, rate, rejects, correct_graded, reject_rate = benign_rates()
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("### Second verifier: benign disagreement rate") :]
    section = section[: section.index("\n## ")] if "\n## " in section else section
    assert f"{errors} of {graded} graded cases ({rate:.1%})" in section
    assert f"{rejects} of {correct_graded} correct answers ({reject_rate:.1%})" in section
    assert f"{len(VERIFIER_UNKNOWN)} unknown" in section
    default = WatchSettings().benign_rate
    assert f"default `benignRate` of {default:g}" in section
    assert default == RewardWatchSpec().benign_rate, "the trainer's default is the spec's"


INTERPRETER_TRUTH = [
    ("a response that stops after the interpreter printed the value", "Let me compute it.\n<interpreter>\n\\boxed{34}\n</interpreter>", "34", "wrong"),
    ("a tool response holding the value, the model's box another", "<tool_response>\n34\n</tool_response>\nSo \\boxed{35}.", "34", "wrong"),
    ("a code fence printing the answer line", "```python\nprint('Answer: 34')\n```\n```output\nAnswer: 34\n```\n", "34", "wrong"),
    ("the model's answer after interpreter output", "<interpreter>\n35\n</interpreter>\nThus \\boxed{34}.", "34", "correct"),
    ("framebox the reward reads", "\\framebox{34}", "34", "correct"),
    ("two boxes: the last one is graded", "\\boxed{12} and then \\boxed{34}", "34", "correct"),
    ("an unparsable ground truth is unknown", "\\boxed{34}", "\\frac{", "unknown"),
    ("an empty ground truth is unknown", "\\boxed{34}", "", "unknown"),
    ("no answer anywhere is wrong", "I could not finish.", "34", "wrong"),
]


@pytest.mark.parametrize(("response", "truth", "expected"), [c[1:] for c in INTERPRETER_TRUTH], ids=[c[0] for c in INTERPRETER_TRUTH])
def test_the_second_verdict_grades_the_answer_region_the_reward_grades(response: str, truth: str, expected: str) -> None:
    assert second_verdict(response, truth) == expected


def test_the_answer_region_is_the_rewards_extracted_answer_else_the_prose_without_tool_output() -> None:
    assert answer_region("<interpreter>\\boxed{9}</interpreter> so \\boxed{8}") == ("8", True)
    region, extracted = answer_region("Let me see.\n<tool_response>\n34\n</tool_response>\nhmm")
    assert not extracted and "34" not in region


def test_unknown_is_its_own_count_never_a_disagreement() -> None:
    watcher = BatchWatcher(tokenizer=None, response_length=1, settings=WatchSettings(share=1.0, max_per_step=8), use_mlflow=False)
    samples = [
        Sample(row=0, problem="p", answer="", response="\\boxed{34}", reward_correct=False),  # unknown: no truth to read
        Sample(row=1, problem="p", answer="\\frac{", response="\\boxed{34}", reward_correct=True),  # unknown
        Sample(row=2, problem="p", answer="34", response="\\boxed{34}", reward_correct=True),  # agree
        Sample(row=3, problem="p", answer="34", response="\\boxed{35}", reward_correct=False),  # agree
    ]
    try:
        metrics, table = watcher.verify(samples)
    finally:
        watcher.close()
    assert metrics["reward-watch/verified"] == 2
    assert metrics["reward-watch/disagreement_rate"] == 0.0
    assert metrics["reward-watch/unknown"] == 0.5
    assert table == {}


def test_the_verdicts_budget_bounds_math_verifys_comparison() -> None:
    """A power tower parses at once and then never compares: the budget given, not math-verify's own 5 s, ends it."""
    started = time.monotonic()
    assert second_verdict("\\boxed{2^{1000000000}}", "2", timeout_s=1) == "unknown"
    assert time.monotonic() - started < 4.0, "math-verify's comparison ran past the 1 s it was given"
