"""Evaluate every problem ``n`` times with a bounded number of conversations in flight.

Each sample is one conversation (sequential requests), so the semaphore bounding conversations
also bounds concurrent requests to the endpoint. Results are appended to the jsonl file as they
complete: an interrupted evaluation keeps what it finished.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from retool.evaluate.chat import EndpointError
from retool.evaluate.loop import Chat, ToolExecutor, Transcript, run_conversation
from retool.evaluate.problems import Problem
from retool.evaluate.results import SampleResult

logger = logging.getLogger(__name__)


class Scorer(Protocol):
    def __call__(self, data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None) -> Mapping[str, Any]: ...


def sample_result(problem: Problem, sample_index: int, transcript: Transcript | None, score: Mapping[str, Any], error: str | None = None) -> SampleResult:
    """The jsonl record of one sample (a failed conversation keeps its error and scores as wrong)."""
    return SampleResult(
        problem_index=problem.index,
        sample_index=sample_index,
        data_source=problem.data_source,
        ground_truth=problem.ground_truth,
        pred=score.get("pred"),
        score=float(score["score"]),
        acc=bool(score["acc"]),
        turns=transcript.turns if transcript else 0,
        tool_calls=transcript.tool_calls if transcript else 0,
        tool_failures=transcript.tool_failures if transcript else 0,
        stop=transcript.stop if transcript else "error",
        elapsed_s=round(transcript.elapsed_s, 4) if transcript else 0.0,
        tool_seconds=round(transcript.tool_seconds, 4) if transcript else 0.0,
        usage=dict(transcript.usage) if transcript else {},
        error=error,
        messages=transcript.response_messages if transcript else [],
    )


async def evaluate(
    problems: Sequence[Problem],
    *,
    n: int,
    chat: Chat,
    execute: ToolExecutor,
    tools: Sequence[Mapping[str, Any]],
    score: Scorer,
    max_turns: int,
    concurrency: int,
    max_parallel_calls: int = 1,
    out: Path,
    on_sample: Callable[[SampleResult], None] | None = None,
) -> list[SampleResult]:
    """Run ``n`` samples of every problem; write each result to ``out`` (jsonl) as it completes."""
    if n < 1:
        raise ValueError("n must be at least 1")
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    semaphore = asyncio.Semaphore(concurrency)
    results: list[SampleResult] = []
    out.parent.mkdir(parents=True, exist_ok=True)

    async def one(problem: Problem, sample_index: int) -> SampleResult:
        async with semaphore:
            try:
                transcript = await run_conversation(
                    chat, execute, problem.prompt, tools=tools, max_turns=max_turns, max_parallel_calls=max_parallel_calls, sample_index=sample_index
                )
            except EndpointError as exc:
                logger.warning("problem %d sample %d: %s", problem.index, sample_index, exc)
                return sample_result(problem, sample_index, None, score(problem.data_source, "", problem.ground_truth, problem.extra_info), str(exc))
        # Scoring is CPU-bound with its own time limit: keep it off the event loop.
        scored = await asyncio.to_thread(score, problem.data_source, transcript.response_text(), problem.ground_truth, problem.extra_info)
        return sample_result(problem, sample_index, transcript, scored)

    tasks = [asyncio.create_task(one(p, k)) for p in problems for k in range(n)]
    try:
        with out.open("w") as sink:
            for finished in asyncio.as_completed(tasks):
                result = await finished
                sink.write(result.to_json() + "\n")
                sink.flush()
                results.append(result)
                if on_sample:
                    on_sample(result)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    results.sort(key=lambda r: (r.problem_index, r.sample_index))
    return results
