"""The reward case table through compute_score, plus extraction and normalisation tables."""

from __future__ import annotations

import pytest

from retool.data.schema import RL_SCHEMA
from retool.recipe.reward import equivalence
from retool.recipe.reward.answer import extract_answer, normalize_answer, numbers_equal, parse_number
from retool.recipe.reward.equivalence import looks_explosive
from retool.recipe.reward.score import compute_score, is_equivalent
from tests.recipe_reward import cases
from tests.recipe_reward.cases import ALL, TABLE, Case


def test_table_covers_every_category_with_at_least_100_cases() -> None:
    assert len(ALL) >= 100
    assert len({c.id for c in TABLE}) == len(TABLE), "case ids must be unique"


@pytest.mark.parametrize("case", TABLE, ids=[c.id for c in TABLE])
def test_compute_score(case: Case) -> None:
    result = compute_score("dapo_math", case.response, case.truth)
    assert set(result) == {"score", "acc", "pred", "source", "reward_note"}
    assert result["reward_note"] == "", "a well-formed sample is graded without a note"
    assert result["acc"] == float(case.correct)
    assert result["score"] == (1.0 if case.correct else -1.0)
    assert isinstance(result["pred"], str)


EXTRACT = [
    ("plain boxed", "x \\boxed{3}", "3"),
    ("nested fraction", "\\boxed{\\frac{a}{b^{2}}}", "\\frac{a}{b^{2}}"),
    ("bare token", "\\boxed 17.", "17"),
    ("fbox", "\\fbox{x+1}", "x+1"),
    ("boxed ignores interpreter", "\\boxed{1}<interpreter>\\boxed{2}</interpreter>", "1"),
    ("answer line", "so\nAnswer: $42$.", "$42$"),
    ("answer tag", "<answer>x=3</answer>", "x=3"),
    ("boxed name prefix is not boxed", "\\boxedx{3}\nAnswer: 4", "4"),
    ("nothing", "no answer here", None),
    ("only tool output", "<tool_response>\\boxed{2}</tool_response>", None),
]


@pytest.mark.parametrize(("text", "expected"), [c[1:] for c in EXTRACT], ids=[c[0] for c in EXTRACT])
def test_extract_answer(text: str, expected: str | None) -> None:
    assert extract_answer(text) == expected


NORMALISE = [
    ("dollars thousands and unit", "$1{,}000\\text{ cm}$", "1000"),
    ("degrees", "90^{\\circ}", "90"),
    ("dfrac short", "\\dfrac12", "\\frac{1}{2}"),
    ("unicode minus", "\u22127", "-7"),
    ("leading zeros", "0042", "42"),
    ("assignment", "y = -3", "-3"),
    ("spaces between commands kept", "\\pi r^2", "\\pi r^2"),
    ("left right dropped", "\\left[ 1, 2 \\right]", "[1,2]"),
    ("text unwrapped when alone", "\\text{(B)}", "(B)"),
    ("percent", "12.5\\%", "12.5"),
]


@pytest.mark.parametrize(("raw", "expected"), [c[1:] for c in NORMALISE], ids=[c[0] for c in NORMALISE])
def test_normalize_answer(raw: str, expected: str) -> None:
    assert normalize_answer(raw) == expected


NUMBERS = [
    ("integer", "12", (12, None)),
    ("decimal", "0.25", (0.25, -2)),
    ("fraction", "\\frac{3}{4}", (0.75, None)),
    ("negative fraction", "-\\frac{3}{4}", (-0.75, None)),
    ("slash", "3/4", (0.75, None)),
    ("scientific", "2e3", (2000, 3)),
    ("scientific with decimals", "1.25e2", (125, 0)),
    ("zero denominator", "\\frac{1}{0}", None),
    ("expression", "2\\sqrt{2}", None),
    ("huge exponent", "1e100000", None),
    ("too many digits", "9" * 500, None),
]


@pytest.mark.parametrize(("text", "expected"), [c[1:] for c in NUMBERS], ids=[c[0] for c in NUMBERS])
def test_parse_number(text: str, expected: tuple[float, int | None] | None) -> None:
    parsed = parse_number(text)
    if expected is None:
        assert parsed is None
    else:
        assert parsed is not None
        assert (float(parsed.value), parsed.last_digit) == expected


ROUNDING = [
    ("seven places of a third", "0.3333333", "\\frac{1}{3}", True),
    ("two places of a third are too coarse", "0.33", "\\frac{1}{3}", False),
    ("half a unit off a large integer", "1000000.5", "1000000", False),
    ("noise after an integer is not rounding", "34.0000001", "34", False),
    ("trailing zeros", "34.000", "34", True),
    ("both decimals", "0.1250", "0.125", True),
    ("decimal rounded up", "0.6666667", "\\frac{2}{3}", True),
]


@pytest.mark.parametrize(("a", "b", "equal"), [c[1:] for c in ROUNDING], ids=[c[0] for c in ROUNDING])
def test_numbers_equal_accepts_only_rounding(a: str, b: str, equal: bool) -> None:
    x, y = parse_number(a), parse_number(b)
    assert x is not None and y is not None
    assert numbers_equal(x, y) is equal
    assert numbers_equal(y, x) is equal


EXPLOSIVE = [
    ("tower", "9^{9^{9^9}}", True),
    ("tower with braces inside", "2^{{3}^{4}}", True),
    ("long exponent", "2^{123456}", True),
    ("huge factorial", "10000!", True),
    ("knuth arrows", "3\\uparrow\\uparrow3", True),
    ("ordinary power", "2^{10}", False),
    ("exponential", "e^{i\\pi}", False),
    ("small factorial", "10!", False),
]


@pytest.mark.parametrize(("text", "expected"), [c[1:] for c in EXPLOSIVE], ids=[c[0] for c in EXPLOSIVE])
def test_looks_explosive(text: str, expected: bool) -> None:
    assert looks_explosive(text) is expected


@pytest.mark.parametrize(
    ("pred", "truth"),
    [(1, "1"), ("1", None), ("", "1"), ("1", "")],
    ids=["non-string prediction", "non-string truth", "empty prediction", "empty truth"],
)
def test_is_equivalent_rejects_non_answers(pred: object, truth: object) -> None:
    assert is_equivalent(pred, truth) is False  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("truth", "correct"),
    [(["12", "twelve"], True), (("13", "14"), False), (12, True), (None, False), ("so it is \\boxed{12}", True), ("\\boxed{13}", False)],
    ids=["any of a list", "none of a tuple", "an integer truth", "no truth", "a truth given as a boxed solution", "a wrong boxed truth"],
)
def test_ground_truth_shapes(truth: object, correct: bool) -> None:
    assert compute_score("aime_2025", "\\boxed{12}", truth)["acc"] == float(correct)


def test_numpy_array_ground_truth() -> None:
    import numpy as np

    assert compute_score("aime_2025", "\\boxed{12}", np.array(["11", "12"], dtype=object))["acc"] == 1.0


@pytest.mark.parametrize("module", ["retool.recipe.reward.answer", "retool.recipe.reward.equivalence", "retool.recipe.reward.score"])
def test_docstring_examples_hold(module: str) -> None:
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module))
    assert result.attempted > 0 and result.failed == 0


def test_results_never_repeat_a_column_of_the_rl_data_and_keep_one_type_per_key() -> None:
    """verl makes every result key a column of the trainer's batch (np.array per key, joined with
    DataProto.union): a key the RL data already holds, or a type that varies, breaks the join."""
    right = compute_score("aime_2024", "\\boxed{2}", "2")
    wrong = compute_score("aime_2024", "I think 7", "2")
    shaped = compute_score("aime_2024", "\\boxed{7}", "2", {"num_turns": 4}, tool_turn_shaping=True)
    assert not set(right) & set(RL_SCHEMA.names)
    types = [{key: type(value) for key, value in r.items()} for r in (right, wrong, shaped)]
    assert types[0] == types[1] == types[2]
    assert bool not in types[0].values(), "numpy booleans break verl's validation dump (json)"


TUPLES = [c for c in cases.GRADER_SHAPES if c.response.startswith(("\\boxed{(", "\\boxed{[")) and "." in c.response]


@pytest.mark.parametrize("case", TUPLES, ids=[c.id for c in TUPLES])
def test_tuples_of_numbers_are_decided_without_the_symbolic_stage(case: Case, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cold, busy or timed-out symbolic worker must not turn a tuple of decimals into -1: items are numbers, compared as numbers."""

    def no_symbolic_stage() -> None:
        raise AssertionError("a tuple of plain numbers reached the symbolic stage")

    monkeypatch.setattr(equivalence, "default_pool", no_symbolic_stage)
    assert compute_score("dapo_math", case.response, case.truth)["acc"] == float(case.correct)


# Equation shapes whose values are expressions (``13+21``, ``2\\pi``): only these may need sympy.
EQUATIONS_WITH_AN_EXPRESSION = {"equation chain through a sum", "an equation chain with a false middle", "an equation with pi on one side is not true"}
EQUATIONS_OF_NUMBERS = [c for c in cases.EQUATIONS if c.id not in EQUATIONS_WITH_AN_EXPRESSION]


@pytest.mark.parametrize("case", EQUATIONS_OF_NUMBERS, ids=[c.id for c in EQUATIONS_OF_NUMBERS])
def test_equations_of_numbers_are_decided_without_the_symbolic_stage(case: Case, monkeypatch: pytest.MonkeyPatch) -> None:
    """``m+n=34`` reached sympy and so waited for a worker's cold start (seconds, issue 48); a side that is a number is compared as one."""

    def no_symbolic_stage() -> None:
        raise AssertionError("an equation of plain numbers reached the symbolic stage")

    monkeypatch.setattr(equivalence, "default_pool", no_symbolic_stage)
    assert compute_score("dapo_math", case.response, case.truth)["acc"] == float(case.correct)


@pytest.mark.parametrize(
    ("text", "sides"),
    [
        ("m+n=34", ["m+n", "34"]),
        ("f(x=1)=2", ["f(x=1)", "2"]),
        ("\\{a=1\\}=b", ["\\{a=1\\}", "b"]),
        ("\\(m=3\\)", ["\\(m", "3\\)"]),
        ("(1,2]=x", ["(1,2]", "x"]),
    ],
    ids=["plain", "inside parentheses", "inside a set", "math delimiters are no group", "a half-open interval closes"],
)
def test_split_top_level(text: str, sides: list[str]) -> None:
    assert equivalence.split_top_level(text, "=") == sides


@pytest.mark.parametrize(
    ("norm", "named"),
    [("m+n", True), ("AB", True), ("\\theta", True), ("f(2)", True), ("2\\sqrt{3}", False), ("\\frac{\\pi}{2}", False), ("\\emptyset", False), ("34", False)],
    ids=["a sum of unknowns", "a segment", "a Greek unknown", "a function value", "a root", "pi", "the empty set", "a number"],
)
def test_names_a_quantity(norm: str, named: bool) -> None:
    assert equivalence.names_a_quantity(norm) is named
