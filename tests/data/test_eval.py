"""AIME 2024 / 2025 -> eval parquet in the RL layout, data_source = the set's name."""

from __future__ import annotations

import pytest

from retool.data.eval import parse_eval_row, prepare_eval
from retool.data.report import MalformedRowError
from retool.data.schema import AGENT_NAME, ANSWER_INSTRUCTION
from tests.data.helpers import read_rows, write_jsonl, write_parquet


@pytest.mark.parametrize(
    ("row", "question", "answer", "source_id"),
    [
        pytest.param({"ID": "2024-I-1", "Problem": "Find $m+n$.", "Solution": "...", "Answer": 204}, "Find $m+n$.", "204", "2024-I-1", id="AIME 2024 columns, integer answer"),
        pytest.param({"id": 0, "problem": "Find $k$.", "answer": "70", "url": "u"}, "Find $k$.", "70", "0", id="AIME 2025 columns"),
        pytest.param({"problem": "Find $k$.", "answer": 33.0}, "Find $k$.", "33", None, id="float answer written as an integer"),
    ],
)
def test_parse_eval_row(row: dict, question: str, answer: str, source_id: str | None) -> None:
    problem = parse_eval_row(row)
    assert (problem.question, problem.answer, problem.source_id) == (question, answer, source_id)


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        pytest.param({"Answer": 3}, "missing problem", id="no problem"),
        pytest.param({"problem": "x", "answer": None}, "missing answer", id="null answer"),
        pytest.param({"problem": "x", "answer": " "}, "missing answer", id="blank answer"),
        pytest.param({"problem": "x", "answer": True}, "missing answer", id="boolean answer"),
    ],
)
def test_parse_eval_row_names_the_problem(row: dict, reason: str) -> None:
    with pytest.raises(MalformedRowError, match=reason):
        parse_eval_row(row)


@pytest.mark.parametrize(
    ("name", "rows", "writer"),
    [
        pytest.param("aime_2024", [{"ID": f"2024-I-{i}", "Problem": f"Problem {i}", "Answer": i} for i in range(3)], write_parquet, id="aime 2024 parquet"),
        pytest.param("aime_2025", [{"id": i, "problem": f"Problem {i}", "answer": str(i)} for i in range(3)], write_jsonl, id="aime 2025 jsonl"),
    ],
)
def test_prepare_eval(tmp_path, name: str, rows: list[dict], writer) -> None:
    rows = [*rows, {"problem": "no answer"}, rows[0]]
    source = writer(tmp_path / ("in.parquet" if writer is write_parquet else "in.jsonl"), rows)
    summary = prepare_eval(str(source), str(tmp_path / f"{name}.parquet"), name=name, max_malformed_fraction=1.0)  # counting, not the limit
    assert (summary.rows_read, summary.rows_written, summary.duplicates, summary.malformed) == (5, 3, 1, 1)
    out = read_rows(tmp_path / f"{name}.parquet")
    assert [r["reward_model"]["ground_truth"] for r in out] == ["0", "1", "2"]
    assert {r["data_source"] for r in out} == {name}
    assert out[1]["prompt"] == [{"role": "user", "content": f"Problem 1\n\n{ANSWER_INSTRUCTION}"}]
    assert out[1]["extra_info"]["split"] == "test" and out[1]["agent_name"] == AGENT_NAME
