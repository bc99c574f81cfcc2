"""The SFT data as verl's multi-turn SFT dataset will train on it.

The dataset is built by verl's own ``create_sft_dataset`` from the SFT stage's composed config and
the model's tokenizer, so the loss mask checked here is the one the trainer uses: on verl 0.6.1
``verl/trainer/fsdp_sft_trainer.py`` (the default), on verl 0.9.1 ``verl/trainer/sft_trainer.py``
(the function its ``SFTTrainer._build_dataset`` calls on ``sft_trainer_engine``), passed in as
``create_dataset``. Both build ``MultiTurnSFTDataset`` (``verl/utils/dataset/multiturn_sft_dataset.py``),
whose rows, ``messages``/``tools`` and padding/truncation keys are the same on both lines. What can go
wrong without any error from verl:

- a trajectory longer than ``sft.maxLength`` is cut (``truncation=right``) and loses its answer;
  one whose prompt alone is longer trains on nothing;
- interpreter output trained on as if the model wrote it: tool output left inside an assistant
  message (ReTool-SFT's raw ``<interpreter>`` text, an unconverted file), or a tool turn with a
  ``loss_mask`` override;
- tool calls rendered by the chat template in a form the RL rollout's tool parser
  (``multi_turn.format``) cannot read back: SFT would teach a call format RL never executes.

Lengths come from the template's rendering of each conversation (every row of a small file; of a
large one, a calibration sample and every row that could come near ``sft.maxLength``, the rest
estimated from their size: see :func:`row_lengths`). The token-level checks run on a sample (the
longest rows and rows spread over the file) through verl's dataset as trained (padded, truncated)
and, for truncated rows, an untruncated view (``pad_mode=no_padding``) that attributes each
trained span to its assistant turn.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf, open_dict
from verl.experimental.agent_loop.tool_parser import ToolParser
from verl.utils.dataset.multiturn_sft_dataset import convert_nested_value_to_list_recursive

from retool.preflight.checks import CheckResult
from retool.preflight.episodes import trained_spans
from retool.preflight.fields import files_problems
from retool.preflight.fields import summary as fields_summary

logger = logging.getLogger(__name__)

TOOL_OUTPUT_MARKERS = ("<interpreter>", "</interpreter>", "<tool_response>", "</tool_response>")
"""Text that only interpreter output carries (ReTool-SFT's raw protocol, Qwen's tool turn)."""
MIN_QUOTABLE_OUTPUT = 12
"""Tool outputs shorter than this are not searched for in trained text (an answer may repeat "42")."""
UNTRUNCATED = 1 << 30
EXACT_ALL_ROWS = 512
"""SFT files up to this many rows are tokenized whole for the length report."""
CALIBRATION_ROWS = 256
CANDIDATE_MARGIN = 0.7
LONGEST_EXACT = 32
TEMPLATE_CHECK_ROWS = 8
"""Rows on which the per-turn tokenization is compared with the whole rendering (a template property)."""


def percentiles(lengths: Sequence[int], max_length: int) -> dict[str, Any]:
    """Token-length percentiles and how many rows exceed ``max_length``."""
    values = np.asarray(lengths, dtype=np.int64)
    if values.size == 0:
        return {"rows": 0}
    over = int((values > max_length).sum())
    return {
        "rows": int(values.size),
        "p50": int(np.percentile(values, 50)),
        "p90": int(np.percentile(values, 90)),
        "p99": int(np.percentile(values, 99)),
        "max": int(values.max()),
        "max_length": int(max_length),
        "over_max_length": over,
        "over_fraction": over / values.size,
    }


def sample_rows(lengths: Sequence[int], size: int) -> list[int]:
    """Row indices to check token by token: the longest quarter of ``size`` (at most 16: the costliest
    rows, where truncation shows), the rest spread evenly over the file."""
    count = len(lengths)
    if count <= size:
        return list(range(count))
    longest = [int(i) for i in np.argsort(np.asarray(lengths), kind="stable")[::-1][: min(size // 4, 16)]]
    spread = [int(i) for i in np.linspace(0, count - 1, size - len(longest)).round()]
    return sorted(set(longest) | set(spread))


def plain(value: Any) -> Any:
    """Parquet values as plain Python (numpy arrays to lists, recursively), Nones dropped from dicts."""
    value = convert_nested_value_to_list_recursive(value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def span_problems(span_text: str, tool_outputs: Sequence[str], assistant_texts: Sequence[str]) -> list[str]:
    """Why a trained span holds interpreter output (empty when it does not)."""
    problems = [f"contains {marker!r}" for marker in TOOL_OUTPUT_MARKERS if marker in span_text]
    for output in tool_outputs:
        quoted = output.strip()
        if len(quoted) >= MIN_QUOTABLE_OUTPUT and quoted in span_text and not any(quoted in text for text in assistant_texts):
            problems.append(f"contains the tool output {quoted[:60]!r}")
    return problems


def _call_of(tool_call: Mapping[str, Any]) -> tuple[str, Any]:
    function = tool_call.get("function", tool_call)
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        arguments = json.loads(arguments)
    return function.get("name"), arguments


def _parsed_calls(parser: Any, span: list[int]) -> list[tuple[str, Any]]:
    _, calls = asyncio.run(parser.extract_tool_calls(span))
    return [(call.name, json.loads(call.arguments)) for call in calls]


def untruncated_config(data_config: DictConfig) -> DictConfig:
    view = OmegaConf.create(OmegaConf.to_container(data_config, resolve=True))
    with open_dict(view):
        view.pad_mode = "no_padding"
        view.max_length = UNTRUNCATED
    return view


def rendered_tokens(dataset: Any, tokenizer: Any, rows: Sequence[int]) -> dict[int, int]:
    """Tokens of ``rows`` as the chat template renders each whole conversation (verl's first step)."""
    template_kwargs = dict(getattr(dataset, "apply_chat_template_kwargs", {}) or {})
    texts = []
    for index in rows:
        tools = dataset.tools[index] if dataset.tools is not None else None
        texts.append(tokenizer.apply_chat_template(plain(dataset.messages[index]), tools=tools, tokenize=False, add_generation_prompt=False, **template_kwargs))
    if not texts:
        return {}
    return {index: len(ids) for index, ids in zip(rows, tokenizer(texts, add_special_tokens=False)["input_ids"], strict=True)}


def row_bytes(messages: Any) -> int:
    """UTF-8 bytes of a conversation's contents and tool calls: cheap, and proportional to its tokens."""
    total = 0
    for message in plain(messages):
        total += len(str(message.get("content") or "").encode())
        for call in message.get("tool_calls") or []:
            total += len(json.dumps(call, ensure_ascii=False).encode())
    return total


def estimated_lengths(sizes: Sequence[int], exact: Mapping[int, int]) -> np.ndarray:
    """Every row's tokens: exact where known, else its bytes over the median bytes per token of the known rows."""
    ratio = float(np.median([sizes[i] / max(tokens, 1) for i, tokens in exact.items()])) if exact else 4.0
    lengths = np.asarray(sizes, dtype=np.float64) / max(ratio, 1e-6)
    for index, tokens in exact.items():
        lengths[index] = tokens
    return lengths.round().astype(np.int64)


def length_candidates(estimates: np.ndarray, max_length: int, known: set[int], longest: int = LONGEST_EXACT) -> list[int]:
    """Rows to tokenize exactly: any whose estimate comes near ``max_length``, and the longest ones."""
    near = set(np.flatnonzero(estimates > CANDIDATE_MARGIN * max_length).tolist())
    top = set(np.argsort(estimates, kind="stable")[::-1][:longest].tolist())
    return sorted((near | top) - known)


def row_lengths(dataset: Any, tokenizer: Any, max_length: int) -> tuple[np.ndarray, int]:
    """Token lengths of every row and how many were tokenized exactly.

    Small files are tokenized whole. Larger ones: an evenly spread calibration sample is tokenized,
    every other row is estimated from its bytes, and every row whose estimate comes within
    ``CANDIDATE_MARGIN`` of ``max_length`` (plus the longest) is tokenized too, so the rows that
    would be truncated are counted exactly while a 2,000-row file of 16k-token trajectories costs
    seconds, not minutes.
    """
    count = len(dataset)
    if count <= EXACT_ALL_ROWS:
        exact = rendered_tokens(dataset, tokenizer, list(range(count)))
        return np.asarray([exact[i] for i in range(count)], dtype=np.int64), count
    sizes = [row_bytes(messages) for messages in dataset.messages]
    calibration = sorted({int(i) for i in np.linspace(0, count - 1, CALIBRATION_ROWS).round()})
    exact = rendered_tokens(dataset, tokenizer, calibration)
    exact.update(rendered_tokens(dataset, tokenizer, length_candidates(estimated_lengths(sizes, exact), max_length, set(exact))))
    return estimated_lengths(sizes, exact), len(exact)


def check_row(dataset: Any, view: Any, index: int, tokenizer: Any, parser: Any | None, *, compare_rendering: bool) -> tuple[list[str], dict[str, int]]:
    """Problems of one row, and counts (trained tokens, spans, whether per-turn tokens differ from the whole rendering)."""
    messages = plain(dataset.messages[index])
    trained = dataset[index]
    loss = trained["loss_mask"]
    problems = []
    if int(loss.sum()) == 0:
        problems.append(f"row {index} trains on no token (its prompt alone fills sft.maxLength={dataset.max_length})")
    attended = int(trained["attention_mask"].sum()) if "attention_mask" in trained else len(trained["input_ids"])
    # Not truncated: the trained row is the whole conversation; truncated: verl's untruncated view.
    full = {"input_ids": trained["input_ids"][:attended], "loss_mask": loss[:attended]} if attended < dataset.max_length else view[index]
    spans = trained_spans(full["input_ids"].tolist(), full["loss_mask"].tolist())
    assistants = [m for m in messages if m.get("role") == "assistant"]
    for position, message in enumerate(messages):
        if message.get("role") != "assistant" and message.get("loss_mask") == 1:
            problems.append(f"row {index} message {position} ({message.get('role')}) has loss_mask=1: it is trained on")
    if len(spans) != len(assistants):
        problems.append(f"row {index}: {len(spans)} trained spans for {len(assistants)} assistant turns")
        return problems, {"trained_tokens": int(loss.sum()), "spans": len(spans), "mismatch": 0}
    outputs = [str(m.get("content") or "") for m in messages if m.get("role") == "tool"]
    assistant_texts = [str(m.get("content") or "") for m in assistants]
    for turn, (span, message) in enumerate(zip(spans, assistants, strict=True)):
        text = tokenizer.decode(span)
        problems += [f"row {index} assistant turn {turn} {p}: interpreter output would be trained on" for p in span_problems(text, outputs, assistant_texts)]
        if parser is not None and message.get("tool_calls"):
            expected = [_call_of(call) for call in message["tool_calls"]]
            parsed = _parsed_calls(parser, span)
            if parsed != expected:
                problems.append(f"row {index} assistant turn {turn}: the rollout's tool parser reads {parsed[:1]!r} from the trained tokens, the data holds {expected[:1]!r}")
    mismatch = 0
    if compare_rendering:
        tools = dataset.tools[index] if dataset.tools is not None else None
        template_kwargs = dict(getattr(dataset, "apply_chat_template_kwargs", {}) or {})
        whole = len(tokenizer.apply_chat_template(messages, tools=tools, tokenize=True, add_generation_prompt=False, **template_kwargs))
        mismatch = int(whole != len(full["input_ids"]))
    return problems, {"trained_tokens": int(loss.sum()), "spans": len(spans), "mismatch": mismatch}


SFTDatasetFactory = Callable[[Any, DictConfig, Any, int], Any]
"""``(files, data config, tokenizer, max_samples)`` -> verl's SFT dataset, as the line's SFT trainer builds it."""


def fsdp_sft_dataset(files: Any, data: DictConfig, tokenizer: Any, max_samples: int = -1) -> Any:
    """verl 0.6.1's: ``fsdp_sft_trainer.create_sft_dataset`` (the default line's SFT trainer)."""
    from verl.trainer.fsdp_sft_trainer import create_sft_dataset

    return create_sft_dataset(files, data, tokenizer, max_samples=max_samples)


def check_sft(
    config: DictConfig, tokenizer: Any, *, tool_format: str | None, sample: int, max_truncated_fraction: float, create_dataset: SFTDatasetFactory = fsdp_sft_dataset
) -> tuple[CheckResult, Any]:
    """The ``sft-data`` check on the SFT stage's composed config; returns the result and verl's dataset (None if it did not load).

    ``create_dataset``: the line's SFT dataset factory (default verl 0.6.1's, :func:`fsdp_sft_dataset`)."""
    data = config.data
    problems, total = files_problems(data.train_files, "sft")
    if problems:
        details = {"file": str(data.train_files), "field_problems": [str(p) for p in problems], "field_problem_count": total}
        return CheckResult("sft-data", "sft", "failed", fields_summary(problems, total, "sft"), details), None
    try:
        dataset = create_dataset(data.train_files, data, tokenizer, data.get("train_max_samples", -1))
        view = create_dataset(data.train_files, untruncated_config(data), tokenizer, data.get("train_max_samples", -1))
    except Exception as exc:
        return CheckResult("sft-data", "sft", "failed", f"verl's SFT dataset could not load {data.train_files}: {type(exc).__name__}: {exc}"), None
    if len(dataset) == 0:
        return CheckResult("sft-data", "sft", "failed", f"{data.train_files} has no rows"), dataset
    lengths, tokenized = row_lengths(dataset, tokenizer, int(data.max_length))
    stats = percentiles(lengths.tolist(), int(data.max_length))
    parser = ToolParser.get_tool_parser(tool_format, tokenizer) if tool_format else None
    rows = sample_rows(lengths.tolist(), sample)
    problems: list[str] = []
    mismatched = compared = 0
    for position, index in enumerate(rows):
        try:
            row_problems, counts = check_row(dataset, view, index, tokenizer, parser, compare_rendering=position < TEMPLATE_CHECK_ROWS)
        except Exception as exc:  # verl's dataset refuses the row (roles out of order, a template error): the trainer would too
            problems.append(f"row {index}: verl's SFT dataset raised {type(exc).__name__}: {exc}")
            continue
        problems += row_problems
        mismatched += counts["mismatch"]
        compared += position < TEMPLATE_CHECK_ROWS
    details: dict[str, Any] = {
        "file": str(data.train_files),
        **stats,
        "rows_tokenized": tokenized,
        "rows_checked_token_by_token": len(rows),
        "truncation": data.truncation,
    }
    if tool_format:
        details["tool_parser"] = tool_format
    if problems:
        details["problems"] = problems
        return CheckResult("sft-data", "sft", "failed", f"{len(problems)} problem(s) in {len(rows)} rows checked; first: {problems[0]}", details), dataset
    if stats["over_fraction"] > max_truncated_fraction:
        summary = (
            f"{stats['over_max_length']} of {stats['rows']} trajectories ({stats['over_fraction']:.1%}) are longer than sft.maxLength={stats['max_length']} "
            f"tokens and lose their end (p99 {stats['p99']}, max {stats['max']}); more than the allowed {max_truncated_fraction:.0%}"
        )
        return CheckResult("sft-data", "sft", "failed", summary, details), dataset
    notes = []
    if stats["over_max_length"]:
        notes.append(f"{stats['over_max_length']} trajectories longer than sft.maxLength={stats['max_length']} lose their end")
    if mismatched:
        notes.append(
            f"{mismatched} of {compared} rows: verl trains on per-turn renderings that differ from the whole-conversation rendering"
            " (e.g. a template that re-renders thinking per turn)"
        )
        details["per_turn_rendering_differs"] = mismatched
    summary = f"{stats['rows']} trajectories, tokens p50 {stats['p50']} / p90 {stats['p90']} / p99 {stats['p99']} / max {stats['max']} of sft.maxLength={stats['max_length']}"
    if notes:
        return CheckResult("sft-data", "sft", "warning", summary + "; " + "; ".join(notes), details), dataset
    return CheckResult("sft-data", "sft", "passed", summary + "; assistant tokens only in the loss", details), dataset
