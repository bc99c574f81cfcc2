"""The checks a preflight runs, their exit codes, and what one check found.

Pure data: the runner fills ``CheckResult`` values in, the report renders them, the stage entry
turns the first failure into the process's exit status. A failing check never stops the checks
that do not depend on it, so one run of the preflight shows every problem it can see; checks that
need something that failed are ``skipped`` with the reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Status = Literal["passed", "warning", "failed", "skipped"]

EXIT_OK = 0
EXIT_SETUP = 2
"""The preflight could not start (unreadable spec, bad arguments, missing stage environment): the
same status ``retool.stage`` uses for a stage that could not start its command."""


@dataclass(frozen=True)
class Check:
    name: str
    exit_code: int
    what: str


CHECKS: tuple[Check, ...] = (
    Check("config", 10, "verl composes every rendered stage's overrides and accepts them (Hydra struct mode, validate_config)"),
    Check("tokenizer", 11, "the model's tokenizer loads and has a chat template, which renders the tool schema and tool calls when the run uses the tool"),
    Check("model", 20, "the model's config.json fits the run: context window, heads vs tensor/sequence parallel, vocabulary, rollout memory per device"),
    Check("sft-data", 12, "verl's multi-turn SFT dataset trains on assistant tokens only, and trajectories fit sft.maxLength"),
    Check("rl-data", 13, "the RL prompts name the recipe's agent loop; verl's create_rl_dataset loads them with the rendered config and keeps at least one batch"),
    Check("eval-data", 14, "every eval set names the recipe's agent loop; verl's create_rl_dataset loads it with the rendered config and keeps prompts of each"),
    Check("tools", 15, "verl's tool registry builds the tools of the rendered tool config, with the schema SFT trained on (skipped for a text-only run)"),
    Check("sandbox", 16, "the run's sandbox runs code through the tool (skipped for a text-only run)"),
    Check("reward", 17, "verl loads the reward function and it scores a right and a wrong answer"),
    Check("reward-guard", 21, "the reward function verl's own load_reward_manager builds from the composed config is ours, with the rendered reward_kwargs (both verl lines)"),
    Check(
        "reward-watch",
        22,
        "the second verifier's disagreement with the reward on the RL data's reference answers, against spec.rl.rewardWatch.benignRate (warns when it is set "
        "below the measured rate or far above it; fails only when math-verify cannot run)",
    ),
    Check("rollout", 18, "one scripted rollout per data source through verl's agent loop (tool_agent, or single_turn_agent for a text-only run) and reward loop"),
    Check("trainer-batch", 19, "the rollout output joins the trainer's batch, is scored, dumped and summarised as RayPPOTrainer does"),
)
BY_NAME: dict[str, Check] = {check.name: check for check in CHECKS}
RETRYABLE_CHECKS = frozenset({"sandbox"})
"""Failures that may pass on a later attempt (a sandbox replica still starting); every other check
fails on what the run is (its data, model, config), so a retry would fail the same way."""
PERMANENT_EXIT_CODES: tuple[int, ...] = tuple(sorted(c.exit_code for c in CHECKS if c.name not in RETRYABLE_CHECKS))
"""What the operator's preflight Job fails at once on (``podFailurePolicy`` FailJob), without retries."""


@dataclass(frozen=True)
class CheckResult:
    check: str
    scope: str
    """What was checked: ``sft``, ``rl`` or ``eval`` (the stage whose rendered config was used), or ``run``."""
    status: Status
    summary: str
    details: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.check not in BY_NAME:
            raise ValueError(f"unknown check {self.check!r}; checks are {', '.join(BY_NAME)}")

    @property
    def failed(self) -> bool:
        return self.status == "failed"

    @property
    def label(self) -> str:
        return self.check if self.scope == "run" else f"{self.check}[{self.scope}]"


def first_failure(results: Iterable[CheckResult]) -> CheckResult | None:
    """The failure that names the run's exit status: the earliest check in ``CHECKS`` order."""
    failures = [r for r in results if r.failed]
    if not failures:
        return None
    order = {check.name: index for index, check in enumerate(CHECKS)}
    return min(failures, key=lambda r: order[r.check])


def exit_code(results: Iterable[CheckResult]) -> int:
    failure = first_failure(results)
    return EXIT_OK if failure is None else BY_NAME[failure.check].exit_code


WARNINGS_PREFIX = "preflight passed with warnings: "
"""How a passing preflight's termination message starts: the operator puts it into the run's status."""


def warnings_message(results: Iterable[CheckResult]) -> str | None:
    """One line of every warning of a passing preflight (None without warnings), for the run's status."""
    warnings = [r for r in results if r.status == "warning"]
    if not warnings:
        return None
    return WARNINGS_PREFIX + " | ".join(f"{r.label}: {r.summary}" for r in warnings)


def failure_message(results: Iterable[CheckResult]) -> str | None:
    """One line for the pod's termination message and the operator's condition: which check, and why."""
    results = list(results)
    failure = first_failure(results)
    if failure is None:
        return None
    others = [r.label for r in results if r.failed and r is not failure]
    tail = f" (also failed: {', '.join(others)})" if others else ""
    return f"preflight check {failure.label} failed: {failure.summary}{tail}"
