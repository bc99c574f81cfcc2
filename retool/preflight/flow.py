"""The preflight steps both verl lines run, on the line's own verl code (line-neutral).

The 0.6 line (:mod:`retool.preflight.steps`, verl 0.6.1) and the 0.9 line
(:mod:`retool.preflight.line09`, verl 0.9.1) record results in one :class:`State` and run the same
``sft-data``, ``rollout`` and ``trainer-batch`` checks; what differs between the lines is given as a
:class:`Line`: verl's SFT dataset factory and SFT config, the in-process agent-loop worker, and the
trainer with its training step. This module imports nothing that only one line has.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from retool.preflight import episodes
from retool.preflight.batch import RecordingRollout, StepResult, one_per_source, step_rows
from retool.preflight.checks import CheckResult
from retool.preflight.data import Prompt
from retool.preflight.plan import Plan, PreflightOptions
from retool.preflight.reward import forget_loaded_reward
from retool.preflight.rollout import Limits, rollout_problems, shape_of
from retool.preflight.scripted import InProcessRolloutBase, ScriptedServer
from retool.preflight.sft import SFTDatasetFactory, check_sft
from retool.preflight.tools import tool_schemas
from retool.preflight.verl_config import compose_verl
from retool.recipe.metrics import results_by_source, samples_from_rows, validation_metrics
from retool.recipe.render.command import hydra_overrides
from retool.tracking.evaluation import read_sample_rows

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Line:
    """What one verl line gives the shared checks."""

    verl: str
    """The release, for messages: ``verl 0.6.1``."""
    create_sft_dataset: SFTDatasetFactory
    sft_config: str
    """The SFT program's Hydra config (``sft_trainer`` on 0.6.1, ``sft_trainer_engine`` on 0.9.1)."""
    sft_multiturn: Mapping[str, Any]
    """The multi-turn data keys of that config, for scripted turns of a run without an SFT stage."""
    rollout: Callable[[DictConfig, ScriptedServer], InProcessRolloutBase]
    build_trainer: Callable[[DictConfig, Any, Any, Any, RecordingRollout], Any]
    """``(config, tokenizer, train, val, rollout)`` -> the stage's trainer, as the line's ``main_ppo`` builds it."""
    training_step: Callable[[Any, Any, Sequence[int]], StepResult]
    trainer_scope: Callable[[], AbstractContextManager[Any]] = nullcontext
    """Around the trainer's life: undoes what building it changes in the process."""


@dataclass
class State:
    results: list[CheckResult] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    configs: dict[str, DictConfig] = field(default_factory=dict)

    def add(self, result: CheckResult) -> CheckResult:
        logger.log(logging.ERROR if result.failed else logging.INFO, "preflight %s: %s: %s", result.label, result.status, result.summary)
        self.results.append(result)
        return result

    def blocked(self, scope: str, checks: Sequence[str]) -> str | None:
        """Why a check in ``scope`` cannot run: a needed check failed, was skipped or never ran."""
        stages = set(scope.split("+"))
        for name in checks:
            relevant = [r for r in self.results if r.check == name and (r.scope == "run" or stages & set(r.scope.split("+")))]
            if not relevant:
                return f"needs {name}, which did not run"
            bad = next((r for r in relevant if r.status in ("failed", "skipped")), None)
            if bad is not None:
                return f"needs {bad.label}, which {bad.status}"
        return None

    def skip(self, check: str, scope: str, reason: str) -> None:
        self.add(CheckResult(check, scope, "skipped", reason))


def timed(check: Callable[[], tuple[CheckResult, Any]]) -> tuple[CheckResult, Any]:
    started = time.monotonic()
    result, value = check()
    return CheckResult(result.check, result.scope, result.status, result.summary, {**result.details, "seconds": round(time.monotonic() - started, 2)}), value


def groups(configs: Mapping[str, DictConfig], key: Callable[[DictConfig], Any]) -> list[tuple[str, DictConfig]]:
    """Stages whose ``key`` is equal share one check: [(``"rl+eval"``, the first one's config), ...]."""
    found: dict[str, list[str]] = {}
    first: dict[str, DictConfig] = {}
    for stage, config in configs.items():
        marker = repr(key(config))
        found.setdefault(marker, []).append(stage)
        first.setdefault(marker, config)
    return [("+".join(stages), first[marker]) for marker, stages in found.items()]


def error_text(exc: BaseException) -> str:
    """The exception and where it was raised (the innermost frame), in one line."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}{where}"


@dataclass(frozen=True)
class StageData:
    train: Any
    val: Any
    train_prompts: list[Prompt]
    val_prompts: list[Prompt]


def sft_check(state: State, target: Plan, options: PreflightOptions, tokenizer: Any, line: Line) -> Any:
    """``sft-data`` on the SFT stage, through the line's SFT dataset; returns verl's dataset (None when it did not load)."""
    if "sft" not in target.commands:
        return None
    reason = state.blocked("sft", ["tokenizer", "config"])
    if reason:
        state.skip("sft-data", "sft", reason)
        return None
    ppo = next((state.configs[s] for s in ("rl", "eval") if s in state.configs), None)
    tool_format = str(ppo.actor_rollout_ref.rollout.multi_turn.format) if ppo is not None else None
    result, dataset = timed(
        lambda: check_sft(
            state.configs["sft"],
            tokenizer,
            tool_format=tool_format,
            sample=options.sft_sample,
            max_truncated_fraction=options.max_truncated_fraction,
            create_dataset=line.create_sft_dataset,
        )
    )
    state.add(result)
    for key in ("rows", "p50", "p90", "p99", "max", "over_max_length"):
        if key in result.details:
            state.facts[f"sft_tokens_{key}" if key not in ("rows", "over_max_length") else f"sft_{key}"] = result.details[key]
    return dataset


# ------------------------------------------------------------------------------ rollout, trainer batch


def episode_data_config(state: State, target: Plan, line: Line) -> DictConfig:
    """The SFT data config that tokenizes scripted turns: the run's, or the line's SFT config's multi-turn defaults without SFT."""
    if "sft" in state.configs:
        return state.configs["sft"].data
    rl = target.run.spec.rl
    overrides = {**line.sft_multiturn, "data.max_length": rl.max_prompt_length + rl.max_response_length, "data.truncation": "right"}
    return compose_verl(line.sft_config, hydra_overrides(overrides)).data


def scripted_episodes(
    state: State, target: Plan, stage: str, tokenizer: Any, prompts: Sequence[Prompt], tools: Sequence[Any], work_dir: Path, line: Line
) -> list[episodes.Episode]:
    problems = [(p.question, p.ground_truth) for p in prompts]
    with_tool = target.uses_tools
    path = episodes.write_conversations(work_dir / stage / "episodes.parquet", problems, tools=tool_schemas(tools), with_tool=with_tool)
    dataset = line.create_sft_dataset([str(path)], episode_data_config(state, target, line), tokenizer, -1)
    return episodes.episodes_from_sft(dataset, problems, [tokenizer.eos_token_id], with_tool=with_tool)


def _failure_hint(text: str) -> str:
    if "tensor_dict1 and tensor_dict2" in text:
        return "; a reward result key repeats a column of the trainer's batch"
    if "JSON serializable" in text:
        return "; a reward result value cannot be written to the validation dump"
    return ""


def rollout_checks(
    state: State,
    target: Plan,
    stage: str,
    config: DictConfig,
    options: PreflightOptions,
    *,
    tokenizer: Any,
    data: Mapping[str, StageData],
    tools: Mapping[str, list[Any]],
    right_scores: Mapping[str, float],
    line: Line,
) -> None:
    """``rollout`` and ``trainer-batch`` of one PPO stage, on the line's agent-loop worker and trainer."""
    # A reward whose results do not fit the batch still scores: the rollout then shows what the trainer would do with it.
    # A text-only run has no tool and no sandbox (both skipped with that reason): its rollouts need neither.
    needs = ["tokenizer", "config", "rl-data", "eval-data", *(["tools", "sandbox"] if target.uses_tools else [])]
    reason = state.blocked(stage, needs)
    if reason or stage not in data or (target.uses_tools and stage not in tools) or stage not in right_scores:
        state.skip("rollout", stage, reason or "needs data, tools and reward, which did not load")
        state.skip("trainer-batch", stage, reason or "needs a rollout")
        return
    stage_data, right = data[stage], right_scores[stage]
    # The rl stage validates on the eval sets with the eval stage's sampling settings; when the eval
    # stage is checked too, its validation (with the per-sample dump) covers that path once.
    validates = bool(config.trainer.test_freq and config.trainer.test_freq > 0) or bool(config.trainer.val_before_train)
    validate = stage == "eval" or (validates and "eval" not in target.commands)
    prompts = ([*stage_data.train_prompts] if stage == "rl" else []) + ([*stage_data.val_prompts] if validate else [])
    started = time.monotonic()
    try:
        scripted = scripted_episodes(state, target, stage, tokenizer, prompts, tools.get(stage, []), options.work_dir, line)
    except Exception as exc:
        state.add(CheckResult("rollout", stage, "failed", f"the scripted turns could not be tokenized by verl's SFT dataset: {error_text(exc)}"))
        state.skip("trainer-batch", stage, f"needs rollout[{stage}], which failed")
        return
    server = ScriptedServer(tokenizer, scripted, missing_output_turn=episodes.missing_output_turn(tokenizer, [tokenizer.eos_token_id]))
    rollout_errors: list[str] = []
    batch_errors: list[str] = []
    details: dict[str, Any] = {"flows": []}
    metrics: dict[str, float] = {}
    forget_loaded_reward()
    try:
        rollout = line.rollout(config, server)
    except Exception as exc:
        state.add(CheckResult("rollout", stage, "failed", f"verl's agent-loop worker could not be built: {error_text(exc)}"))
        state.skip("trainer-batch", stage, f"needs rollout[{stage}], which failed")
        return
    with rollout, line.trainer_scope():
        recorder = RecordingRollout(rollout)
        try:
            trainer = line.build_trainer(config, tokenizer, stage_data.train, one_per_source(stage_data.val, stage_data.val_prompts), recorder)
        except Exception as exc:
            state.add(CheckResult("rollout", stage, "skipped", "needs the trainer"))
            state.add(CheckResult("trainer-batch", stage, "failed", f"{line.verl}'s RayPPOTrainer could not be built as main_ppo builds it: {error_text(exc)}"))
            return
        flows: list[tuple[str, Callable[[], Any]]] = []
        if stage == "rl":
            rows = step_rows(stage_data.train_prompts, int(config.actor_rollout_ref.rollout.n), int(config.actor_rollout_ref.rollout.agent.num_workers))
            flows.append(("training step", lambda: line.training_step(trainer, stage_data.train, rows)))
        if validate:
            flows.append(("validation", trainer._validate))
        for name, flow in flows:
            before = len(recorder.outputs)
            details["flows"].append(name)
            try:
                value = flow()
            except Exception as exc:
                logger.debug("%s of %s failed", name, stage, exc_info=True)
                text = error_text(exc)
                (batch_errors if len(recorder.outputs) > before else rollout_errors).append(f"{name}: {text}{_failure_hint(text)}")
                continue
            if name == "validation":
                metrics = dict(value)
        release_loader_workers(trainer)
    seconds = time.monotonic() - started
    shape = shape_of(target.uses_tools)
    spec = target.run.spec
    eval_turns = stage == "eval" and spec.eval.max_turns is not None
    limits = Limits(
        max_turns=spec.eval.max_turns if eval_turns else spec.rl.max_turns,  # type: ignore[arg-type]
        max_turns_field="spec.eval.maxTurns" if eval_turns else "spec.rl.maxTurns",
        max_response_length=spec.rl.max_response_length,
    )
    problems, counts = rollout_problems(recorder.outputs, list(server.transcripts.values()), tokenizer, right, shape, rollout.agents, limits)
    details.update(counts)
    details["seconds"] = round(seconds, 2)
    state.facts[f"{stage}_scripted_rollouts"] = counts["samples"]
    state.facts[f"{stage}_rollout_seconds"] = round(seconds, 2)
    all_rollout = rollout_errors + problems
    if all_rollout:
        state.add(CheckResult("rollout", stage, "failed", all_rollout[0], {**details, "problems": all_rollout}))
    else:
        sources = ", ".join(p.data_source for p in prompts)
        if shape.calls_tool:
            summary = f"{counts['samples']} scripted rollouts of {sources} called the sandbox and scored {right:g}"
        else:
            summary = f"{counts['samples']} scripted single-turn rollouts of {sources} (verl's {shape.agent}, no tool) scored {right:g}"
        state.add(CheckResult("rollout", stage, "passed", summary, details))
    if metrics:
        batch_errors += validation_problems(metrics, config, [p.data_source for p in stage_data.val_prompts], right)
        dump = config.trainer.get("validation_data_dir")
        if dump:
            batch_errors += dump_problems(Path(str(dump)) / "0.jsonl", [p.data_source for p in stage_data.val_prompts])
    batch_details = {"flows": details["flows"], "validation_metrics": {k: v for k, v in metrics.items() if k.startswith("val-core/")}}
    if batch_errors:
        state.add(CheckResult("trainer-batch", stage, "failed", batch_errors[0], {**batch_details, "problems": batch_errors}))
    elif all_rollout:
        state.skip("trainer-batch", stage, f"needs rollout[{stage}], which failed")
    else:
        summary = f"{' and '.join(details['flows'])} joined, scored and summarised the rollouts as {line.verl}'s RayPPOTrainer does"
        state.add(CheckResult("trainer-batch", stage, "passed", summary, batch_details))


LOADERS = ("train_dataloader", "val_dataloader")


def release_loader_workers(trainer: Any) -> None:
    """Stop the worker processes of the trainer's data loaders now, while their queues are alive.

    torchdata's ``StatefulDataLoader`` keeps its last iterator (``self._iterator``, for ``state_dict``;
    torchdata 0.11.0 stateful_dataloader.py ``__iter__``), so a loader's ``dataloader_num_workers``
    processes (8 by default) outlive the validation that started them. Left to the garbage collector,
    the trainer's cycle is torn down in no set order: with the index queues gone first, no worker hears
    the shutdown and ``_shutdown_workers`` waits out its 5 s join per worker (``MP_STATUS_CHECK_INTERVAL``)
    before it terminates them - 40 s in the middle of a later check, in the preflight Job as in the tests."""
    for attribute in LOADERS:
        loader = getattr(trainer, attribute, None)
        iterator = getattr(loader, "_iterator", None)
        if iterator is None:
            continue
        loader._iterator = None  # type: ignore[union-attr]
        shutdown = getattr(iterator, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()


def validation_problems(metrics: Mapping[str, float], config: DictConfig, sources: Sequence[str], right: float) -> list[str]:
    """verl's validation metrics must name every eval set and report the scripted answers as right."""
    n = int(config.actor_rollout_ref.rollout.val_kwargs.n)
    problems = []
    for source in sources:
        core = "acc" if f"val-core/{source}/acc/mean@{n}" in metrics else "reward"
        key = f"val-core/{source}/{core}/mean@{n}"
        expected = 1.0 if core == "acc" else right
        if key not in metrics:
            problems.append(f"verl's validation metrics have no {key} (got {sorted(k for k in metrics if k.startswith('val-core/'))[:4]})")
        elif abs(float(metrics[key]) - expected) > 1e-6:
            problems.append(f"{key} is {metrics[key]:g}; every scripted answer is right, so it must be {expected:g}")
    return problems


def dump_problems(path: Path, sources: Sequence[str]) -> list[str]:
    """The eval stage's per-sample dump must give retool's eval report one result per eval set."""
    if not path.exists():
        return [f"verl wrote no validation dump at {path}"]
    try:
        results = results_by_source(validation_metrics(*samples_from_rows(read_sample_rows(str(path)))))
    except ValueError as exc:
        return [f"retool's eval report cannot read verl's validation dump: {exc}"]
    if sorted(results) != sorted(sources):
        return [f"retool's eval report files the validation dump's results under {sorted(results)}, the eval sets are {sorted(sources)}"]
    return []
