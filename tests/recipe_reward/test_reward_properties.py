"""Property tests over generated adversarial responses: bounded time, well-formed results, no exceptions.

Texts are built from the pieces the reward's regexes and brace matcher react to (unclosed tags,
boxes, braces, answer lines and statements, fences, LaTeX commands, invisible characters) and
repeated into long inputs, where any quadratic pass would take seconds to minutes. The bounds are on
this thread's CPU time (``time.thread_time``), not the wall clock: a linear pass over 300k characters
takes 0.04 s here, and the wall clock of a busy CI worker read 3.5 s for it (the process waiting for a
core). Where the reward waits on its symbolic worker, the wall clock is bounded too, loosely: that
bound catches a timeout not kept, not slowness. bench/bench_reward.py records the real worst case.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from retool.recipe.reward.answer import extract_answer, normalize_answer
from retool.recipe.reward.score import MAX_PRED_CHARS, compute_score

FRAGMENTS = [
    "<answer>", "</answer>", "<interpreter>", "</interpreter>", "<tool_response>", "<code>", "</code>",
    "\\boxed{", "\\boxed ", "\\fbox{", "\\framebox[1cm]{", "{", "}", "\\{", "\\}", "\\\\", "$", "$$",
    "Answer:", "Final Answer: ", "the answer is ", "The final answer is ", "answer is", "\n", " ", "  \t",
    "```python\n", "```output\n", "```", "\\text{", "\\text{ cm}", "^2", "\\frac", "\\frac{1}{2}", "\\sqrt",
    "\\pi", "\\overline{3}", "0.", "34", "-", ".", ",", "(C)", "\\textbf{(C)}\\ ", "%", "\\%", "\\left(",
    "\\right)", "\\begin{pmatrix}", "\\end{pmatrix}", "&", "\u200b", "\ufeff", "\u00bd", "\u2205", "**",
    "x^{", "9^{9^{9^9}}", "!", "=", "\\dfrac", "\\varnothing", "<", ">", "'", '"',
]  # fmt: skip

fragment = st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=6))
unit = st.lists(fragment, min_size=1, max_size=8).map("".join).filter(bool)
TARGET_CHARS = 300_000
"""Every generated unit is repeated up to this size: ~5x a 16k-token rollout."""

odd_value = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=8), st.binary(max_size=8), st.lists(st.integers(), max_size=3))
extra_info = st.one_of(
    st.none(),
    st.dictionaries(st.sampled_from(["num_turns", "tool_rewards", "tool_turn_shaping", "index", "rollout_reward_scores"]), odd_value, max_size=4),
    odd_value,
)
ground_truth = st.one_of(st.sampled_from(["34", "\\frac{1}{2}", "2\\sqrt{2}", "C", "\\emptyset"]), odd_value, st.lists(st.text(max_size=6), max_size=3))

SETTINGS = settings(max_examples=40, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.fixture(scope="module", autouse=True)
def warm_pool() -> None:
    """The first symbolic comparison starts the worker pool (seconds of sympy imports): not the reward's per-call cost."""
    assert compute_score("d", "\\boxed{2\\sqrt{2}}", "\\sqrt{8}")["acc"] == 1.0


@SETTINGS
@given(unit=unit)
def test_extraction_stays_linear_on_repeated_adversarial_text(unit: str) -> None:
    text = unit * (TARGET_CHARS // len(unit) + 1)
    started = time.thread_time()
    answer = extract_answer(text)
    if answer is not None:
        normalize_answer(answer[:4000])
    cpu = time.thread_time() - started
    assert cpu < 1.5, f"{cpu:.2f} s of CPU extracting from {len(text)} chars of {unit!r} repeated"


@SETTINGS
@given(head=unit, repeats=st.integers(1, 20_000), tail=st.text(max_size=200), truth=ground_truth, info=extra_info, shaping=odd_value)
def test_compute_score_is_bounded_and_well_formed_on_anything(head: str, repeats: int, tail: str, truth: Any, info: Any, shaping: Any) -> None:
    text = (head * repeats)[:TARGET_CHARS] + tail
    started, cpu_started = time.perf_counter(), time.thread_time()
    result = compute_score("dapo", text, truth, info, tool_turn_shaping=shaping, timeout_s=0.5)
    elapsed, cpu = time.perf_counter() - started, time.thread_time() - cpu_started
    assert cpu < 3.0, f"{cpu:.2f} s of CPU scoring {len(text)} chars"
    assert elapsed < 30.0, f"{elapsed:.2f} s scoring {len(text)} chars with a 0.5 s symbolic budget"
    assert set(result) == {"score", "acc", "pred", "source", "reward_note"}
    assert type(result["score"]) is float and type(result["acc"]) is float
    assert type(result["pred"]) is str and len(result["pred"]) <= MAX_PRED_CHARS
    assert type(result["reward_note"]) is str and len(result["reward_note"]) <= 300
    assert result["score"] == 1.0 or -1.0 <= result["score"] <= -0.6
    assert result["acc"] == float(result["score"] == 1.0)


@SETTINGS
@given(solution=odd_value, truth=ground_truth, info=extra_info)
def test_a_response_that_is_not_text_is_minus_one_with_a_reason(solution: Any, truth: Any, info: Any) -> None:
    if isinstance(solution, str):
        return
    result = compute_score("dapo", solution, truth, info)
    assert result["score"] == -1.0 and result["acc"] == 0.0 and result["reward_note"]
