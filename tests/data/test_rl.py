"""DAPO-Math-17k -> RL parquet: instruction replacement, deduplication, malformed-row accounting, layout."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from retool.data.dedup import question_key
from retool.data.report import MalformedRowError
from retool.data.rl import parse_dapo_row, prepare_rl, strip_answer_instruction
from retool.data.schema import AGENT_NAME, ANSWER_INSTRUCTION, RL_SCHEMA
from tests.data.helpers import DAPO_PREFIX, DAPO_SUFFIX, dapo_row, read_rows, write_jsonl, write_parquet


@pytest.mark.parametrize(
    ("text", "expected", "stripped"),
    [
        pytest.param(DAPO_PREFIX + "What is 1+1?" + DAPO_SUFFIX, "What is 1+1?", True, id="dapo prefix and suffix are removed"),
        pytest.param("What is 1+1?" + DAPO_SUFFIX, "What is 1+1?", True, id="suffix alone is removed"),
        pytest.param(
            DAPO_PREFIX + "What is 1+1?" + DAPO_SUFFIX + "\n\nPlease reason step by step, and put your final answer within \\boxed{}.",
            "What is 1+1?",
            True,
            id="a boxed instruction appended by an earlier pipeline is removed too",
        ),
        pytest.param("Find $x$ if $x^2=4$.", "Find $x$ if $x^2=4$.", False, id="a bare problem is kept as is"),
        pytest.param("  Find the answer: 3 apples.  ", "Find the answer: 3 apples.", False, id="answer words inside a problem are not instructions"),
    ],
)
def test_strip_answer_instruction(text: str, expected: str, stripped: bool) -> None:
    assert strip_answer_instruction(text) == (expected, stripped)


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        pytest.param({"prompt": [], "reward_model": {"ground_truth": "1"}}, "missing or empty prompt", id="empty prompt list"),
        pytest.param({"reward_model": {"ground_truth": "1"}}, "missing or empty prompt", id="no prompt"),
        pytest.param({"prompt": [{"role": "system", "content": "x"}], "reward_model": {"ground_truth": "1"}}, "prompt has no user message", id="no user turn"),
        pytest.param({"prompt": [{"role": "user", "content": None}], "reward_model": {"ground_truth": "1"}}, "user message content is not text", id="null content"),
        pytest.param({"prompt": [{"role": "user", "content": DAPO_PREFIX + DAPO_SUFFIX}], "reward_model": {"ground_truth": "1"}}, "empty question", id="only instructions"),
        pytest.param({"prompt": "What?", "reward_model": {"ground_truth": " "}}, "missing reward_model.ground_truth", id="blank ground truth"),
        pytest.param({"prompt": "What?", "reward_model": None}, "missing reward_model.ground_truth", id="no reward model"),
        pytest.param({"prompt": "What?", "reward_model": {"ground_truth": "2"}, "data_source": 3}, "data_source is not text", id="numeric data source"),
        pytest.param(["not", "a", "row"], "row is a list, not an object", id="row is a list"),
    ],
)
def test_parse_dapo_row_names_the_problem(row: object, reason: str) -> None:
    with pytest.raises(MalformedRowError, match=reason):
        parse_dapo_row(row)


@pytest.mark.parametrize(
    ("question", "leftover"),
    [
        pytest.param("Find x. The last line should be Answer: $Answer please.", True, id="a variant of the DAPO instruction"),
        pytest.param("Find x and put it in \\boxed{} at the end, thanks.", True, id="a boxed instruction mid-text"),
        pytest.param("Find x, where Answer: 3 is not it.", False, id="the word Answer alone"),
    ],
)
def test_unrecognised_instructions_are_flagged(question: str, leftover: bool) -> None:
    assert parse_dapo_row(dapo_row(question, "1", wrap=False)).leftover_instruction is leftover


def test_parse_dapo_row_reads_numbers_and_ids() -> None:
    problem = parse_dapo_row(dapo_row("What is 6*7?", 42.0, index="abc"))
    assert (problem.question, problem.ground_truth, problem.source_id, problem.data_source, problem.instruction_stripped) == ("What is 6*7?", "42", "abc", "math_dapo", True)


def dapo_rows(unique: int, repeats: int) -> list[dict]:
    """``unique`` problems repeated ``repeats`` times, interleaved as in the public copy."""
    return [dapo_row(f"Problem {i}: compute {i} + {i}.", str(2 * i), index=f"id-{r}-{i}") for r in range(repeats) for i in range(unique)]


def test_prepare_rl_deduplicates_and_writes_one_instruction(tmp_path) -> None:
    source = write_parquet(tmp_path / "dapo.parquet", dapo_rows(unique=50, repeats=7))
    out = tmp_path / "out" / "rl.parquet"
    summary = prepare_rl(str(source), str(out), batch_rows=64)  # batches smaller than the repeat period
    assert (summary.rows_read, summary.rows_written, summary.duplicates, summary.malformed) == (350, 50, 300, 0)
    assert summary.counters["instruction_replaced"] == 50
    assert summary.counters["unrecognised_instruction_left"] == 0
    assert pq.read_schema(out).equals(RL_SCHEMA, check_metadata=False)
    rows = read_rows(out)
    assert [r["extra_info"]["index"] for r in rows] == list(range(50))
    first = rows[0]
    assert first["prompt"] == [{"role": "user", "content": f"Problem 0: compute 0 + 0.\n\n{ANSWER_INSTRUCTION}"}]
    assert first["reward_model"] == {"style": "rule", "ground_truth": "0"}
    assert (first["data_source"], first["ability"], first["agent_name"]) == ("math_dapo", "MATH", AGENT_NAME)
    assert first["extra_info"] == {"index": 0, "split": "train", "source_id": "id-0-0", "question": "Problem 0: compute 0 + 0."}
    for row in rows:
        content = row["prompt"][0]["content"]
        assert content.count(ANSWER_INSTRUCTION) == 1
        assert "Answer: $Answer" not in content and "Remember to put your answer" not in content


def test_malformed_rows_are_counted_with_examples_including_their_repeats(tmp_path) -> None:
    rows = dapo_rows(unique=5, repeats=2)
    rows.insert(3, dapo_row("No answer here", None, index="bad-1"))
    rows.insert(6, dapo_row("No answer here", None, index="bad-1"))  # the same bad row again: counted twice
    no_user = dapo_row("hi", "1", index="bad-2")
    no_user["prompt"][0]["role"] = "system"
    rows.append(no_user)
    source = write_parquet(tmp_path / "dapo.parquet", rows)
    summary = prepare_rl(str(source), str(tmp_path / "rl.parquet"), max_malformed_fraction=1.0)  # counting, not the limit
    assert (summary.rows_read, summary.rows_written, summary.duplicates, summary.malformed) == (13, 5, 5, 3)
    assert summary.malformed_by_reason == {"missing reward_model.ground_truth": 2, "prompt has no user message": 1}
    assert [e.where.rsplit("#", 1)[1] for e in summary.malformed_examples] == ["3", "6", "12"]
    assert "No answer here" in summary.malformed_examples[0].snippet
    assert "malformed, missing reward_model.ground_truth: 2" in summary.render()


def test_repeated_question_with_another_answer_is_reported(tmp_path) -> None:
    rows = [dapo_row("Same question", "1"), dapo_row("Same question", "2"), dapo_row("Same question", "1")]
    summary = prepare_rl("rows", str(tmp_path / "rl.parquet"), batches=_as_batches(rows))
    assert (summary.rows_written, summary.duplicates, summary.counters["duplicate_questions_with_different_answer"]) == (1, 2, 1)
    assert read_rows(tmp_path / "rl.parquet")[0]["reward_model"]["ground_truth"] == "1"


SAME_OR_DISTINCT = [
    pytest.param("What is 1 + 1?", "What  is 1 +\t1?", True, id="runs of spaces and tabs between words count as one space"),
    pytest.param("Find x.\nThen y.", "Find x. Then y.", True, id="a line break between words is a space"),
    pytest.param("  Find x.\n", "Find x.", True, id="whitespace around the question does not count"),
    pytest.param("Compute 12 3.", "Compute 123.", False, id="whitespace between two characters is not removed"),
    pytest.param("Let $a b$ be given.", "Let $ab$ be given.", False, id="a space inside math separates symbols"),
    pytest.param("What is 1+1?", "what is 1+1?", False, id="case counts"),
    pytest.param("What is 1+1?", "What is 1+1.", False, id="punctuation counts"),
]


@pytest.mark.parametrize(("first", "second", "same"), SAME_OR_DISTINCT)
def test_question_key_ignores_only_the_amount_of_whitespace(first: str, second: str, same: bool) -> None:
    """docs/recipe.md: questions are the same when their words are, whatever the whitespace between
    and around them; whitespace is never dropped between two characters."""
    assert (question_key(first) == question_key(second)) is same


@pytest.mark.parametrize(("first", "second", "same"), SAME_OR_DISTINCT)
def test_prepare_rl_deduplicates_by_that_key(tmp_path, first: str, second: str, same: bool) -> None:
    rows = [dapo_row(first, "7", wrap=False), dapo_row(second, "7", wrap=False)]
    summary = prepare_rl("rows", str(tmp_path / "rl.parquet"), batches=_as_batches(rows))
    assert (summary.rows_written, summary.duplicates) == ((1, 1) if same else (2, 0))


def _as_batches(rows: list[dict]):
    from retool.data.sources import RowBatch

    return [RowBatch(origin="rows", start=0, rows=rows)]


def test_parquet_and_jsonl_give_the_same_output(tmp_path) -> None:
    """The vectorised Arrow path (parquet) and the row path (jsonl) must agree row for row."""
    rows = [*dapo_rows(unique=20, repeats=3), dapo_row("Broken", None)]
    prepare_rl(str(write_parquet(tmp_path / "a.parquet", rows)), str(tmp_path / "a.out.parquet"), batch_rows=16)
    prepare_rl(str(write_jsonl(tmp_path / "b.jsonl", rows)), str(tmp_path / "b.out.parquet"), batch_rows=16)
    assert read_rows(tmp_path / "a.out.parquet") == read_rows(tmp_path / "b.out.parquet")


def test_data_source_override(tmp_path) -> None:
    source = write_parquet(tmp_path / "dapo.parquet", dapo_rows(unique=2, repeats=1))
    prepare_rl(str(source), str(tmp_path / "rl.parquet"), data_source="dapo_math_17k")
    assert {r["data_source"] for r in read_rows(tmp_path / "rl.parquet")} == {"dapo_math_17k"}


def test_no_valid_row_is_an_error_and_leaves_the_previous_output(tmp_path) -> None:
    out = tmp_path / "rl.parquet"
    (tmp_path / ".rl.parquet.999.tmp").write_bytes(b"left by a killed attempt")
    prepare_rl(str(write_parquet(tmp_path / "good.parquet", dapo_rows(unique=3, repeats=1))), str(out))
    before = out.read_bytes()
    bad = write_jsonl(tmp_path / "bad.jsonl", ["{not json", '"a string"', {"prompt": "x"}])
    with pytest.raises(ValueError, match=r"no valid rows \(3 read, 3 malformed"):
        prepare_rl(str(bad), str(out))
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl", "good.parquet", "rl.parquet"]  # no temporary left behind
