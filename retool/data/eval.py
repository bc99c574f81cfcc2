"""AIME-style evaluation sets -> the RL parquet layout, one file per set, ``data_source`` = the set's name.

AIME 2024 (Maxwell-Jia/AIME_2024) spells its columns ``Problem``/``Answer``, AIME 2025
(yentinglin/aime_2025) ``problem``/``answer``; both are accepted (case-insensitive), and the prompt
gets the same single answer instruction as training, so validation scores measure the same task.
The set's name becomes ``data_source``, which verl uses in metric names (val-core/aime_2024/...).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from retool.data.conversion import converting
from retool.data.dedup import QuestionDeduplicator
from retool.data.report import MalformedRowError, PrepareSummary, limit_counter, reached
from retool.data.rl import strip_answer_instruction
from retool.data.schema import AGENT_NAME, EVAL_SPLIT, RL_SCHEMA, rl_row
from retool.data.sources import BadLine, RowBatch
from retool.data.writer import DEFAULT_MAX_MALFORMED_FRACTION, AtomicParquetWriter

logger = logging.getLogger(__name__)

QUESTION_COLUMNS = ("problem", "question")
ANSWER_COLUMNS = ("answer",)
ID_COLUMNS = ("id", "problem_id", "url")


@dataclass(frozen=True)
class EvalProblem:
    question: str
    answer: str
    source_id: str | None


def _field(row: Mapping[str, Any], names: tuple[str, ...]) -> Any:
    lowered = {str(key).lower(): value for key, value in row.items() if value is not None}  # "Problem" and "problem" may both exist
    for name in names:
        if lowered.get(name) is not None:
            return lowered[name]
    return None


def parse_eval_row(row: Any) -> EvalProblem:
    """Read an AIME row; raise ``MalformedRowError`` when the problem or the answer is missing."""
    if isinstance(row, BadLine):
        raise MalformedRowError(row.reason)
    if not isinstance(row, Mapping):
        raise MalformedRowError(f"row is a {type(row).__name__}, not an object")
    question = _field(row, QUESTION_COLUMNS)
    if not isinstance(question, str) or not question.strip():
        raise MalformedRowError("missing problem")
    answer = _field(row, ANSWER_COLUMNS)
    if isinstance(answer, bool) or not isinstance(answer, str | int | float):
        raise MalformedRowError("missing answer")
    answer_text = str(int(answer)) if isinstance(answer, float) and answer.is_integer() else str(answer).strip()
    if not answer_text:
        raise MalformedRowError("missing answer")
    source_id = _field(row, ID_COLUMNS)
    stripped, _ = strip_answer_instruction(question)
    return EvalProblem(question=stripped, answer=answer_text, source_id=None if source_id is None else str(source_id))


def prepare_eval(
    source: str,
    out: str,
    *,
    name: str,
    split: str = "train",
    agent_name: str = AGENT_NAME,
    max_rows: int | None = None,
    batches: Iterable[RowBatch] | None = None,
    max_malformed_fraction: float = DEFAULT_MAX_MALFORMED_FRACTION,
    staged: list[AtomicParquetWriter] | None = None,
    **source_options: Any,
) -> PrepareSummary:
    """Convert one AIME-style set into ``out`` with ``data_source = name``; return and log the summary.

    ``agent_name`` routes the rows to verl's agent loop (the text-only baseline's single-turn one);
    ``max_rows`` stops once that many problems are written."""
    dedup = QuestionDeduplicator()
    with converting(
        f"eval:{name}", source, out, RL_SCHEMA, split=split, batches=batches, batch_rows=4096,
        max_malformed_fraction=max_malformed_fraction, staged=staged, source_options=source_options,
    ) as (summary, log, writer, batches):  # fmt: skip
        index = 0
        for batch in batches:
            if reached(max_rows, index):
                break
            summary.rows_read += len(batch)
            for offset, row in enumerate(batch.to_rows()):
                if reached(max_rows, index):
                    break
                try:
                    problem = parse_eval_row(row)
                except MalformedRowError as exc:
                    log.add(batch.where(offset), str(exc), row)
                    continue
                if not dedup.admit(problem.question, problem.answer, batch.where(offset)):
                    continue
                writer.write(
                    rl_row(
                        data_source=name,
                        question=problem.question,
                        ground_truth=problem.answer,
                        index=index,
                        split=EVAL_SPLIT,
                        source_id=problem.source_id,
                        agent_name=agent_name,
                    )
                )
                index += 1
        summary.duplicates = dedup.duplicates
        summary.counters = {"duplicate_questions_with_different_answer": dedup.conflicts, **limit_counter(max_rows, index)}
    return summary
