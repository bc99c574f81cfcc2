"""Re-execute every code block of a set of trajectories and score their final answers.

Code blocks are independent scripts (ReTool's prompt asks for complete scripts, and the
sandbox keeps no state between calls), so every block of every trajectory runs concurrently,
bounded by ``concurrency``. Code runs through the same tool path as RL rollouts, so the check
answers "will RL show the model what SFT taught it to expect?".
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from retool.data_check.compare import AGREEING, MISMATCH, NOT_RECORDED, compare_output
from retool.data_check.trajectories import Trajectory
from retool.evaluate.loop import ToolResult

RunCode = Callable[[str], Awaitable[ToolResult]]
Score = Callable[..., Mapping[str, Any]]


@dataclass
class StepReport:
    step: int
    verdict: str
    similarity: float
    sandbox_status: str
    elapsed_s: float
    diff: str = ""
    recorded: str | None = None
    actual: str = ""


@dataclass
class TrajectoryReport:
    index: int
    question: str
    steps: list[StepReport]
    ground_truth: str | None
    pred: str | None
    acc: bool | None
    """None when the row carries no ground truth to score against."""

    @property
    def all_agree(self) -> bool:
        return all(s.verdict in AGREEING or s.verdict == NOT_RECORDED for s in self.steps)


@dataclass
class CheckReport:
    source: str
    trajectories: list[TrajectoryReport]
    unreadable: list[str] = field(default_factory=list)

    def metrics(self) -> dict[str, float]:
        """Figures logged to MLflow and printed in the summary (``data_check/...``).

        A share is present only when something was measured: no recorded output means no
        ``output_agreement``, no row with a ground truth no ``answer_accuracy`` (a 0 there would
        read as every answer wrong, a 1 as every output reproduced)."""
        steps = [s for t in self.trajectories for s in t.steps]
        recorded = [s for s in steps if s.verdict != NOT_RECORDED]
        scored = [t for t in self.trajectories if t.acc is not None]
        verdicts: dict[str, float] = {}
        for s in steps:
            verdicts[f"data_check/blocks/{s.verdict}"] = verdicts.get(f"data_check/blocks/{s.verdict}", 0.0) + 1
        trajectories = self.trajectories
        shares = {  # name: (numerator, denominator); left out when the denominator is 0
            "data_check/blocks_per_trajectory": (len(steps), len(trajectories)),
            "data_check/output_agreement": (sum(1 for s in recorded if s.verdict in AGREEING), len(recorded)),
            "data_check/trajectories_consistent": (sum(1 for t in trajectories if t.all_agree), len(trajectories)),
            "data_check/answers_extracted": (sum(1 for t in trajectories if t.pred), len(trajectories)),
            "data_check/answer_accuracy": (sum(1 for t in scored if t.acc), len(scored)),
        }
        return {
            "data_check/trajectories": float(len(self.trajectories)),
            "data_check/unreadable_rows": float(len(self.unreadable)),
            "data_check/blocks": float(len(steps)),
            "data_check/answers_scored": float(len(scored)),
            **{name: part / whole for name, (part, whole) in shares.items() if whole},
            "data_check/sandbox_seconds": sum(s.elapsed_s for s in steps),
            **verdicts,
        }

    @property
    def ok(self) -> bool:
        """No unreadable rows, no mismatched outputs and no wrong answers."""
        return not self.unreadable and all(t.all_agree and t.acc is not False for t in self.trajectories)

    def problems(self) -> list[str]:
        """One line per thing a data owner should look at."""
        lines = [f"unreadable: {u}" for u in self.unreadable]
        for t in self.trajectories:
            for s in t.steps:
                if s.verdict == MISMATCH:
                    lines.append(f"row {t.index} block {s.step}: output differs from the sandbox (similarity {s.similarity:.2f}, sandbox {s.sandbox_status})")
            if t.acc is False:
                lines.append(f"row {t.index}: final answer {t.pred!r} is wrong (expected {t.ground_truth!r})")
            elif t.ground_truth is not None and not t.pred:
                lines.append(f"row {t.index}: no final answer found")
        return lines


async def check_trajectories(
    trajectories: Sequence[Trajectory],
    *,
    run_code: RunCode,
    score: Score,
    extract: Callable[[str], str | None],
    data_source: str,
    concurrency: int = 8,
    on_block: Callable[[], None] | None = None,
    source: str = "",
) -> CheckReport:
    """Run every block (at most ``concurrency`` at a time), compare, score, and build the report."""
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    semaphore = asyncio.Semaphore(concurrency)

    async def block(step_number: int, code: str, recorded: str | None) -> StepReport:
        async with semaphore:
            result = await run_code(code)
        if on_block:
            on_block()
        comparison = compare_output(recorded, result.text)
        return StepReport(
            step=step_number,
            verdict=comparison.verdict,
            similarity=round(comparison.similarity, 4),
            sandbox_status=result.status,
            elapsed_s=round(result.elapsed_s, 4),
            diff=comparison.diff,
            recorded=recorded,
            actual=result.text,
        )

    async def trajectory(t: Trajectory) -> TrajectoryReport:
        steps = await asyncio.gather(*(block(i, s.code, s.recorded) for i, s in enumerate(t.steps)))
        pred, acc = None, None
        if t.ground_truth is not None:
            scored = await asyncio.to_thread(score, data_source, t.final_text, t.ground_truth)
            pred, acc = scored.get("pred"), bool(scored["acc"])
        else:
            pred = extract(t.final_text)
        return TrajectoryReport(index=t.index, question=t.question, steps=list(steps), ground_truth=t.ground_truth, pred=pred, acc=acc)

    reports = await asyncio.gather(*(trajectory(t) for t in trajectories))
    return CheckReport(source=source, trajectories=list(reports))
