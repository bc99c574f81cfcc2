"""DAPO-Math-17k -> verl RL parquet: deduplicated, with one answer instruction, routed to the tool agent.

The public DAPO-Math-17k parquet holds ~1.79M rows that are ~17k prompts repeated. Converting every
row to Python would dominate the run, so each Arrow batch is first collapsed to its distinct
(prompt, answer) pairs with vectorised Arrow code; only a pair never seen before is converted and
checked in Python. Counting stays exact: a pair's repeats are counted as duplicates when its first
row was accepted, and as malformed (with the same reason) when it was rejected.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from retool.data.conversion import converting
from retool.data.dedup import QuestionDeduplicator, digest
from retool.data.report import MalformedLog, MalformedRowError, PrepareSummary, limit_counter, reached
from retool.data.schema import AGENT_NAME, RL_SCHEMA, RL_TRAIN_SPLIT, rl_row
from retool.data.sources import BadLine, RowBatch
from retool.data.writer import DEFAULT_MAX_MALFORMED_FRACTION, AtomicParquetWriter

logger = logging.getLogger(__name__)

DEFAULT_DATA_SOURCE = "math_dapo"

# DAPO wraps each problem in its own format instruction ("... of the form Answer: $Answer ..." before,
# "Remember to put your answer on its own line after "Answer:"." after). Both are removed, as is a
# \boxed instruction a previous pipeline may have appended, before the one ANSWER_INSTRUCTION is added.
_PREFIXES = (
    re.compile(
        r"^\s*Solve the following math problem step by step\.\s*The last line of your response should be of the form"
        r"\s*Answer:\s*\$Answer\s*\(without quotes\)\s*where\s*\$Answer\s*is the answer to the problem\.\s*",
        re.IGNORECASE,
    ),
)
_SUFFIXES = (
    re.compile(r"\s*Remember to put your answer on its own line after\s*[\"“]?Answer:?[\"”]?\s*\.?\s*$", re.IGNORECASE),
    re.compile(r"\s*(?:Please\s+)?(?:reason step by step,?\s*and\s+)?put your final answer within\s*\\boxed\{\}\s*\.?\s*$", re.IGNORECASE),
)


# What a format instruction the patterns above missed would look like (a DAPO variant, another source).
_LEFTOVER = re.compile(r"Answer:\s*\$Answer|on its own line after\s*[\"“]?Answer|\\boxed\{\}", re.IGNORECASE)


def has_leftover_instruction(question: str) -> bool:
    """True when a question still carries an answer-format instruction after stripping: reported, since it
    would contradict ANSWER_INSTRUCTION."""
    return _LEFTOVER.search(question) is not None


def strip_answer_instruction(text: str) -> tuple[str, bool]:
    """The bare problem of a DAPO prompt, and whether any format instruction was removed.

    >>> strip_answer_instruction('Solve the following math problem step by step. The last line of your response should be of the form '
    ...     'Answer: $Answer (without quotes) where $Answer is the answer to the problem.\\n\\nWhat is 1+1?\\n\\n'
    ...     'Remember to put your answer on its own line after "Answer:".')
    ('What is 1+1?', True)
    """
    stripped = text
    changed = True
    while changed:
        changed = False
        for pattern in _PREFIXES + _SUFFIXES:
            new = pattern.sub("", stripped, count=1)
            if new != stripped:
                stripped, changed = new, True
    stripped = stripped.strip()
    return stripped, stripped != text.strip()


@dataclass(frozen=True)
class Problem:
    question: str
    ground_truth: str
    data_source: str
    ability: str
    source_id: str | None
    instruction_stripped: bool
    leftover_instruction: bool = False


def _text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)
    return None


def parse_dapo_row(row: Any, default_data_source: str = DEFAULT_DATA_SOURCE) -> Problem:
    """Validate one DAPO-format row; raise ``MalformedRowError`` naming the first problem found."""
    if isinstance(row, BadLine):
        raise MalformedRowError(row.reason)
    if not isinstance(row, Mapping):
        raise MalformedRowError(f"row is a {type(row).__name__}, not an object")
    prompt = row.get("prompt")
    if isinstance(prompt, str):
        content = prompt
    elif isinstance(prompt, list | tuple) and prompt:
        users = [m for m in prompt if isinstance(m, Mapping) and m.get("role") == "user"]
        if not users:
            raise MalformedRowError("prompt has no user message")
        content = users[-1].get("content")
        if not isinstance(content, str):
            raise MalformedRowError("user message content is not text")
    else:
        raise MalformedRowError("missing or empty prompt")
    question, stripped = strip_answer_instruction(content)
    if not question:
        raise MalformedRowError("empty question")
    reward_model = row.get("reward_model")
    truth = _text(reward_model.get("ground_truth")) if isinstance(reward_model, Mapping) else None
    if truth is None or not truth.strip():
        raise MalformedRowError("missing reward_model.ground_truth")
    data_source = row.get("data_source")
    if data_source is not None and not isinstance(data_source, str):
        raise MalformedRowError("data_source is not text")
    extra = row.get("extra_info")
    source_id = _text(extra.get("index")) if isinstance(extra, Mapping) else None
    ability = row.get("ability")
    return Problem(
        question=question,
        ground_truth=truth.strip(),
        data_source=data_source or default_data_source,
        ability=ability if isinstance(ability, str) and ability else "MATH",
        source_id=source_id,
        instruction_stripped=stripped,
        leftover_instruction=has_leftover_instruction(question),
    )


def without_instructions(row: Any) -> Any:
    """The row as reported: DAPO's boilerplate removed from its prompt, so the example shows the problem."""
    if not isinstance(row, Mapping) or not isinstance(row.get("prompt"), list):
        return row
    prompt = [
        {**m, "content": strip_answer_instruction(m["content"])[0]} if isinstance(m, Mapping) and isinstance(m.get("content"), str) else m for m in row["prompt"]
    ]
    return {**row, "prompt": prompt}


def batch_pair_keys(batch: pa.RecordBatch) -> pa.Array | None:
    """Per row: all prompt texts joined with the ground truth, or null when a part is missing.

    None when the batch does not have DAPO's Arrow layout at all; the caller then converts every row.
    """
    names = batch.schema.names
    if "prompt" not in names or "reward_model" not in names:
        return None
    prompt, reward_model = batch.column("prompt"), batch.column("reward_model")
    try:
        if not pa.types.is_struct(reward_model.type):
            return None
        truth = pc.cast(pc.struct_field(reward_model, "ground_truth"), pa.string())
        if pa.types.is_string(prompt.type) or pa.types.is_large_string(prompt.type):
            texts = pc.cast(prompt, pa.string())
        elif pa.types.is_list(prompt.type) and pa.types.is_struct(prompt.type.value_type):
            messages = prompt.flatten()
            parts = pc.binary_join_element_wise(
                pc.cast(pc.struct_field(messages, "role"), pa.string()), pc.cast(pc.struct_field(messages, "content"), pa.string()), "\x1d"
            )
            lengths = pc.fill_null(pc.list_value_length(prompt), 0).to_numpy(zero_copy_only=False)
            offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
            texts = pc.binary_join(pa.ListArray.from_arrays(offsets, parts, mask=prompt.is_null()), "\x1e")
        else:
            return None
        keys = pc.binary_join_element_wise(texts, truth, "\x1f")
        keys.validate(full=True)  # bytes that are not UTF-8: the row-by-row path reports those rows as malformed
        return keys
    except (pa.ArrowException, KeyError, ValueError):
        return None


def distinct_pairs(keys: pa.Array) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
    """(distinct keys, row of each key's first occurrence, its count, rows whose key is null)."""
    encoded = keys.dictionary_encode()
    codes = pc.fill_null(encoded.indices, -1).to_numpy(zero_copy_only=False)
    values, first, counts = np.unique(codes, return_index=True, return_counts=True)
    dictionary = encoded.dictionary.to_pylist()
    keep = values >= 0
    null_rows = np.flatnonzero(codes < 0)
    return [dictionary[v] for v in values[keep]], first[keep], counts[keep], null_rows


class RLConverter:
    """Holds the state of one preparation: what was seen, accepted, rejected; writes accepted rows."""

    def __init__(
        self, writer: AtomicParquetWriter, *, split: str, data_source: str | None, log: MalformedLog, agent_name: str = AGENT_NAME, max_rows: int | None = None
    ):
        self.writer = writer
        self.agent_name = agent_name
        self.max_rows = max_rows
        self.split = split
        self.data_source = data_source
        self.log = log
        self.questions = QuestionDeduplicator()
        self.accepted_pairs: set[bytes] = set()
        self.rejected_pairs: dict[bytes, str] = {}
        self.pair_duplicates = 0
        self.instruction_stripped = 0
        self.leftover_instruction = 0
        self.written = 0

    @property
    def full(self) -> bool:
        """``max_rows`` rows are written: the rest of the source is not read."""
        return reached(self.max_rows, self.written)

    def convert(self, row: Any, where: str) -> str | None:
        """Write the row if it is valid and new; the reason when it is malformed, None otherwise."""
        if self.full:
            return None
        try:
            problem = parse_dapo_row(row)
        except MalformedRowError as exc:
            self.log.add(where, str(exc), without_instructions(row))
            return str(exc)
        if not self.questions.admit(problem.question, problem.ground_truth, where):
            return None
        self.instruction_stripped += problem.instruction_stripped
        if problem.leftover_instruction:
            self.leftover_instruction += 1
            if self.leftover_instruction <= 5:
                logger.warning("%s: an answer-format instruction remains in the question after stripping: %s", where, problem.question[-160:])
        self.writer.write(
            rl_row(
                data_source=self.data_source or problem.data_source,
                question=problem.question,
                ground_truth=problem.ground_truth,
                index=self.written,
                split=self.split,
                source_id=problem.source_id,
                ability=problem.ability,
                agent_name=self.agent_name,
            )
        )
        self.written += 1
        return None

    def feed(self, batch: RowBatch) -> None:
        keys = batch_pair_keys(batch.arrow) if batch.arrow is not None else None
        if keys is None:
            for offset, row in enumerate(batch.to_rows()):
                self.convert(row, batch.where(offset))
            return
        texts, first, counts, null_rows = distinct_pairs(keys)
        fresh: list[tuple[int, bytes, int]] = []
        for text, row_index, count in zip(texts, first.tolist(), counts.tolist(), strict=True):
            key = digest(text)
            if key in self.accepted_pairs:
                self.pair_duplicates += count
            elif key in self.rejected_pairs:
                self.log.add(batch.where(row_index), self.rejected_pairs[key], times=count)
            else:
                fresh.append((row_index, key, count))
        # Rows with a missing part, and first occurrences of new pairs, in file order.
        todo = sorted([(int(i), None, 1) for i in null_rows] + fresh, key=lambda item: item[0])
        if not todo:
            return
        rows = batch.arrow.take(pa.array([i for i, _, _ in todo], type=pa.int64())).to_pylist()
        for (row_index, key, count), row in zip(todo, rows, strict=True):
            reason = self.convert(row, batch.where(row_index))
            if key is None:
                continue
            if reason is None:
                self.accepted_pairs.add(key)
                self.pair_duplicates += count - 1
            else:
                self.rejected_pairs[key] = reason
                if count > 1:
                    self.log.add(batch.where(row_index), reason, times=count - 1)


def prepare_rl(
    source: str,
    out: str,
    *,
    split: str = "train",
    data_source: str | None = None,
    output_split: str = RL_TRAIN_SPLIT,
    agent_name: str = AGENT_NAME,
    max_rows: int | None = None,
    batches: Iterable[RowBatch] | None = None,
    max_malformed_fraction: float = DEFAULT_MAX_MALFORMED_FRACTION,
    staged: list[AtomicParquetWriter] | None = None,
    **source_options: Any,
) -> PrepareSummary:
    """Convert a DAPO-format source into ``out`` (verl RL parquet); return and log the summary.

    ``data_source`` overrides each row's own; ``batches`` replaces reading ``source`` (tests, pipelines);
    ``agent_name`` routes rows to verl's agent loop; ``max_rows`` stops once that many distinct prompts are written.
    Raises ``ValueError`` (``SourceError``, ``TooManyMalformedError``) when the source cannot be read,
    yields no valid row or more than ``max_malformed_fraction`` malformed ones, leaving ``out``
    untouched. With ``staged``, the output is finished but left for the caller to publish.
    """
    with converting(
        "rl", source, out, RL_SCHEMA, split=split, batches=batches,
        max_malformed_fraction=max_malformed_fraction, staged=staged, source_options=source_options,
    ) as (summary, log, writer, batches):  # fmt: skip
        converter = RLConverter(writer, split=output_split, data_source=data_source, log=log, agent_name=agent_name, max_rows=max_rows)
        for batch in batches:
            if converter.full:
                break
            summary.rows_read += len(batch)
            converter.feed(batch)
        summary.duplicates = converter.pair_duplicates + converter.questions.duplicates
        summary.counters = {
            "instruction_replaced": converter.instruction_stripped,
            "unrecognised_instruction_left": converter.leftover_instruction,
            "duplicate_questions_with_different_answer": converter.questions.conflicts,
            **limit_counter(max_rows, converter.written),
        }
    return summary
