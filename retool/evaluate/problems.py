"""Evaluation problems from files in the layout ``retool data prepare eval`` writes.

A row has a ``prompt`` (a list of chat messages, or a plain string taken as the user message),
the expected answer in ``reward_model.ground_truth`` (raw AIME files' ``answer``/``Answer`` is
accepted too), and a ``data_source`` naming the benchmark (``aime_2024``...), which selects the
reward and groups the metrics. Parquet, jsonl and json files are read; a bad row is an error
naming the file, the row and the field, before any request is sent.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_DATA_SOURCE = "aime"


class ProblemFileError(ValueError):
    """An evaluation file cannot be read or one of its rows lacks what evaluation needs."""


@dataclass(frozen=True)
class Problem:
    index: int
    prompt: tuple[dict[str, Any], ...]
    ground_truth: str
    data_source: str
    extra_info: dict[str, Any] = field(default_factory=dict)


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Rows of a parquet, jsonl or json (list of objects) file."""
    if not path.is_file():
        raise ProblemFileError(f"{path}: no such file")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            return pq.read_table(path).to_pylist()
        except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid / ArrowIOError: not a parquet file
            raise ProblemFileError(f"{path}: not a readable parquet file: {' '.join(str(exc).split())}") from exc
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ProblemFileError(f"{path}: cannot be read as UTF-8 text: {exc}") from exc
    if suffix == ".jsonl":
        rows = []
        for number, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ProblemFileError(f"{path}:{number}: not JSON: {exc}") from exc
        return rows
    if suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ProblemFileError(f"{path}: not JSON: {exc}") from exc
        if not isinstance(data, list):
            raise ProblemFileError(f"{path}: expected a JSON list of rows")
        return data
    raise ProblemFileError(f"{path}: unsupported file type {suffix!r} (parquet, jsonl or json)")


def problem_from_row(row: Mapping[str, Any], index: int) -> Problem:
    """One row as a Problem; raises ProblemFileError naming the missing or malformed field."""
    if not isinstance(row, Mapping):
        raise ProblemFileError(f"row {index}: expected an object, got {type(row).__name__}")
    prompt = row.get("prompt", row.get("problem", row.get("Problem")))
    if isinstance(prompt, str):
        messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    elif isinstance(prompt, Iterable) and not isinstance(prompt, Mapping):
        messages = [dict(m) for m in prompt if isinstance(m, Mapping)]
        if not messages or any("role" not in m or "content" not in m for m in messages):
            raise ProblemFileError(f"row {index}: 'prompt' must be a list of messages with 'role' and 'content'")
    else:
        raise ProblemFileError(f"row {index}: missing 'prompt' (a list of chat messages or a string)")
    reward_model = row.get("reward_model") if isinstance(row.get("reward_model"), Mapping) else {}
    truth = reward_model.get("ground_truth", row.get("answer", row.get("Answer")))
    if truth is None or str(truth).strip() == "":
        raise ProblemFileError(f"row {index}: missing 'reward_model.ground_truth' (or 'answer')")
    extra = row.get("extra_info") if isinstance(row.get("extra_info"), Mapping) else {}
    return Problem(
        index=index,
        prompt=tuple(messages),
        ground_truth=str(truth).strip(),
        data_source=str(row.get("data_source") or DEFAULT_DATA_SOURCE),
        extra_info=dict(extra),
    )


def load_problems(path: Path, limit: int | None = None) -> list[Problem]:
    """Every problem of a file (the first ``limit`` when given); errors name the file and row."""
    rows = read_rows(path)
    if limit is not None:
        rows = rows[:limit]
    if not rows:
        raise ProblemFileError(f"{path}: no rows")
    problems = []
    for index, row in enumerate(rows):
        try:
            problems.append(problem_from_row(row, index))
        except ProblemFileError as exc:
            raise ProblemFileError(f"{path}: {exc}") from exc
    return problems
