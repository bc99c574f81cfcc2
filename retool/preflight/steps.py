"""The preflight's steps: each runs one kind of check for the stages that need it and records the result.

The steps share a :class:`State` (results so far, composed configs). Each asks the state whether
what it needs passed; if not it records ``skipped`` with the reason and returns nothing, so later
steps skip in turn. The checks themselves live in ``sft``, ``data``, ``tools``, ``reward`` and
``rollout``; this module wires them to the run's stages.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from verl import DataProto
from verl.trainer.fsdp_sft_trainer import create_sft_dataset
from verl.trainer.ppo.utils import need_critic
from verl.utils import hf_tokenizer
from verl.utils.config import validate_config
from verl.utils.dataset.rl_dataset import collate_fn

from retool.data.schema import TEXT_AGENT_NAME, code_interpreter_tool
from retool.preflight import episodes
from retool.preflight.agent import InProcessRollout, ScriptedServer
from retool.preflight.checks import CheckResult
from retool.preflight.data import Prompt, check_eval_data, check_rl_data, first_prompts
from retool.preflight.plan import PPO_STAGES, Plan, PreflightOptions
from retool.preflight.reward import AGENT_LOOP_COLUMNS, check_reward, forget_loaded_reward
from retool.preflight.rollout import Limits, rollout_problems, shape_of
from retool.preflight.sandbox_probe import TEXT_ONLY_SANDBOX, check_sandbox
from retool.preflight.sft import check_sft, plain
from retool.preflight.tokenizer_files import tokenizer_source_problem
from retool.preflight.tools import check_tools, tool_schemas
from retool.preflight.trainer import RecordingRollout, build_trainer, one_per_source, step_rows, training_step
from retool.preflight.verl_config import VALIDATION_DIR_KEY, compose_stage, compose_verl, preflight_overrides, stage_files
from retool.recipe.metrics import results_by_source, samples_from_rows, validation_metrics
from retool.recipe.render.command import hydra_overrides
from retool.recipe.tool.config import TOOL_NAME
from retool.tracking.evaluation import read_sample_rows

logger = logging.getLogger(__name__)


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


# ------------------------------------------------------------------------------ tokenizer, config


def tokenizer_check(state: State, options: PreflightOptions, *, trust_remote_code: bool, tools: bool) -> Any:
    """``tokenizer``: it loads, has a chat template and an end-of-sequence token; for a run with the
    tool (``tools``), the template also renders the tool schema and assistant tool calls."""
    source = options.tokenizer
    where = tokenizer_source_problem(source)
    if where is not None:
        state.add(CheckResult("tokenizer", "run", "failed", f"the tokenizer did not load: {where}"))
        return None
    try:
        tokenizer = hf_tokenizer(source, trust_remote_code=trust_remote_code)
    except Exception as exc:
        state.add(CheckResult("tokenizer", "run", "failed", f"the tokenizer at {source} did not load: {error_text(exc)}"))
        return None
    details = {"source": source, "class": type(tokenizer).__name__, "vocab": len(tokenizer), "eos_token": tokenizer.eos_token, "pad_token": tokenizer.pad_token}
    if not tokenizer.chat_template:
        state.add(CheckResult("tokenizer", "run", "failed", f"the tokenizer at {source} has no chat template", details))
        return None
    if tokenizer.eos_token_id is None:
        state.add(CheckResult("tokenizer", "run", "failed", f"the tokenizer at {source} has no end-of-sequence token", details))
        return None
    question = "What is 1 + 1?"
    if not tools:
        try:
            tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False)
        except Exception as exc:
            state.add(CheckResult("tokenizer", "run", "failed", f"the chat template failed on a user message: {error_text(exc)}", details))
            return None
        state.add(CheckResult("tokenizer", "run", "passed", f"{details['class']} with a chat template (recipe text-only: no tool schema needed)", details))
        return tokenizer
    try:
        with_tools = tokenizer.apply_chat_template([{"role": "user", "content": question}], tools=[code_interpreter_tool()], add_generation_prompt=True, tokenize=False)
        call = tokenizer.apply_chat_template(plain(episodes.conversation(question, "2")[:2]), tokenize=False)
    except Exception as exc:
        state.add(CheckResult("tokenizer", "run", "failed", f"the chat template failed on a tool conversation: {error_text(exc)}", details))
        return None
    if TOOL_NAME not in with_tools:
        state.add(CheckResult("tokenizer", "run", "failed", "the chat template ignores tools: the model would never see the code_interpreter schema", details))
        return None
    if TOOL_NAME not in call:
        state.add(CheckResult("tokenizer", "run", "failed", "the chat template drops assistant tool calls: SFT would never show the model a call", details))
        return None
    state.add(CheckResult("tokenizer", "run", "passed", f"{details['class']} with a chat template that renders tools and tool calls", details))
    return tokenizer


def config_checks(state: State, target: Plan, options: PreflightOptions) -> None:
    """Compose each stage's command into verl's config; PPO stages also pass verl's start-up checks."""
    for stage, command in target.commands.items():
        try:
            if command.config_name == "ppo_trainer":
                copies = stage_files(command, options.work_dir)
                config = compose_stage(command, preflight_overrides(command, tokenizer=options.tokenizer, file_copies=copies, work_dir=options.work_dir))
            else:
                config = compose_stage(command)
        except Exception as exc:
            state.add(CheckResult("config", stage, "failed", f"verl's {command.config_name} config rejects the rendered overrides: {error_text(exc)}"))
            continue
        details: dict[str, Any] = {"config_name": command.config_name, "overrides": len(command.overrides)}
        if command.config_name == "ppo_trainer":
            problem = ppo_config_problem(config)
            if problem is not None:
                state.add(CheckResult("config", stage, "failed", problem, details))
                continue
        state.configs[stage] = config
        state.add(CheckResult("config", stage, "passed", f"{len(command.overrides)} rendered overrides compose into {command.config_name}", details))


def ppo_config_problem(config: DictConfig) -> str | None:
    """What ``main_ppo`` and ``AgentLoopManager`` would refuse at start-up, or None."""
    arr = config.actor_rollout_ref
    use_reference = bool(config.algorithm.use_kl_in_reward or arr.actor.use_kl_loss)
    try:
        validate_config(config=config, use_reference_policy=use_reference, use_critic=need_critic(config))
    except Exception as exc:
        return f"verl's validate_config refuses the config: {error_text(exc)}"
    samples, workers = int(config.data.train_batch_size) * int(arr.rollout.n), int(arr.rollout.agent.num_workers)
    if samples % workers:
        return f"a step's {samples} rollouts (spec.rl.batchSize x spec.rl.rolloutN) do not split evenly between the {workers} agent-loop workers"
    return None


# ------------------------------------------------------------------------------ sft


def sft_check(state: State, target: Plan, options: PreflightOptions, tokenizer: Any) -> Any:
    if "sft" not in target.commands:
        return None
    reason = state.blocked("sft", ["tokenizer", "config"])
    if reason:
        state.skip("sft-data", "sft", reason)
        return None
    ppo = next((state.configs[s] for s in ("rl", "eval") if s in state.configs), None)
    tool_format = str(ppo.actor_rollout_ref.rollout.multi_turn.format) if ppo is not None else None
    result, dataset = timed(
        lambda: check_sft(state.configs["sft"], tokenizer, tool_format=tool_format, sample=options.sft_sample, max_truncated_fraction=options.max_truncated_fraction)
    )
    state.add(result)
    for key in ("rows", "p50", "p90", "p99", "max", "over_max_length"):
        if key in result.details:
            state.facts[f"sft_tokens_{key}" if key not in ("rows", "over_max_length") else f"sft_{key}"] = result.details[key]
    return dataset


# ------------------------------------------------------------------------------ data, tools, reward


@dataclass(frozen=True)
class StageData:
    train: Any
    val: Any
    train_prompts: list[Prompt]
    val_prompts: list[Prompt]


def tool_config_path(config: DictConfig) -> str | None:
    """The stage's rendered tool config (a text-only stage renders none)."""
    path = config.actor_rollout_ref.rollout.multi_turn.get("tool_config_path")
    return str(path) if path else None


def tool_config_text(config: DictConfig) -> str | None:
    path = tool_config_path(config)
    return Path(path).read_text(encoding="utf-8") if path else None


def data_key(config: DictConfig) -> Any:
    """What decides how prompts load: the data config, with the tool config by content (each stage has its own copy)."""
    data = OmegaConf.to_container(config.data, resolve=True)
    data.pop("tool_config_path", None)
    return data, tool_config_text(config)


def data_checks(state: State, target: Plan, ppo: Mapping[str, DictConfig], tokenizer: Any) -> dict[str, StageData]:
    expected = [eval_set.name for eval_set in target.run.spec.data.eval]
    recipe = target.run.spec.recipe
    data: dict[str, StageData] = {}
    for scope, config in groups(ppo, data_key):
        reason = state.blocked(scope, ["tokenizer", "config"])
        if reason:
            state.skip("rl-data", scope, reason)
            state.skip("eval-data", scope, reason)
            continue
        rl_result, train = timed(partial(check_rl_data, config, tokenizer, scope, recipe))
        eval_result, val = timed(partial(check_eval_data, config, tokenizer, scope, expected, recipe))
        state.add(rl_result)
        state.add(eval_result)
        state.facts.setdefault("rl_prompts_kept", rl_result.details.get("kept", len(train) if train is not None else 0))
        state.facts.setdefault("eval_prompts_kept", eval_result.details.get("kept", len(val) if val is not None else 0))
        if train is None or val is None or len(train) == 0 or len(val) == 0:
            continue
        stage_data = StageData(train, val, first_prompts(train), first_prompts(val))
        for stage in scope.split("+"):
            data[stage] = stage_data
    return data


TEXT_ONLY_TOOLS = f"recipe text-only: the rollouts run verl's {TEXT_AGENT_NAME} with no tool, so the rendered config has no tool config to build"


def tool_checks(state: State, target: Plan, ppo: Mapping[str, DictConfig], options: PreflightOptions, sft_dataset: Any) -> dict[str, list[Any]]:
    if not target.uses_tools:
        # Shown as skipped, with the reason, so the report says why no tool or sandbox was checked.
        scope = "+".join(stage for stage in PPO_STAGES if stage in target.commands)
        if scope:
            state.skip("tools", scope, TEXT_ONLY_TOOLS)
            state.skip("sandbox", scope, TEXT_ONLY_SANDBOX)
        return {}
    sft_tools = plain(sft_dataset.tools[0]) if sft_dataset is not None and sft_dataset.tools else None
    built: dict[str, list[Any]] = {}
    for scope, config in groups(ppo, tool_config_text):
        reason = state.blocked(scope, ["config"])
        if reason:
            state.skip("tools", scope, reason)
            state.skip("sandbox", scope, reason)
            continue
        path = tool_config_path(config)
        if path is None:
            missing = "the rendered config has no actor_rollout_ref.rollout.multi_turn.tool_config_path: verl's tool agent would run without the code interpreter"
            state.add(CheckResult("tools", scope, "failed", missing))
            state.skip("sandbox", scope, f"needs tools[{scope}], which failed")
            continue
        result, tools = timed(partial(check_tools, path, scope, sft_tools))
        state.add(result)
        if result.failed:
            state.skip("sandbox", scope, f"needs tools[{scope}], which failed")
            continue
        state.add(check_sandbox(tools, scope, wait_s=options.sandbox_wait_s))
        for stage in scope.split("+"):
            built[stage] = tools
    return built


def batch_columns(dataset: Any) -> list[str]:
    """Non-tensor columns of the trainer's batch: a collated row of the dataset, plus what verl adds."""
    row = DataProto.from_single_dict(collate_fn([dataset[0]]))
    return sorted(set(row.non_tensor_batch) | set(AGENT_LOOP_COLUMNS))


def reward_checks(state: State, target: Plan, ppo: Mapping[str, DictConfig], data: Mapping[str, StageData]) -> dict[str, float]:
    right_scores: dict[str, float] = {}
    key = lambda c: (OmegaConf.to_container(c.custom_reward_function, resolve=True), OmegaConf.to_container(c.reward_model, resolve=True))  # noqa: E731
    for scope, config in groups(ppo, key):
        stages = scope.split("+")
        reason = state.blocked(scope, ["config", "rl-data", "eval-data"])
        if reason or stages[0] not in data:
            state.skip("reward", scope, reason or "needs prompts, which did not load")
            continue
        stage_data = data[stages[0]]
        dumps = any(target.commands[s].overrides.get(VALIDATION_DIR_KEY) for s in stages)
        prompts = [*stage_data.train_prompts, *stage_data.val_prompts]
        columns = batch_columns(stage_data.train)
        result, right = timed(partial(check_reward, config, scope, prompts, columns, dumps_validation=dumps))
        state.add(result)
        if right is not None:
            for stage in stages:
                right_scores[stage] = right
    return right_scores


# ------------------------------------------------------------------------------ rollout, trainer batch


def episode_data_config(state: State, target: Plan) -> DictConfig:
    """The SFT data config that tokenizes scripted turns: the run's, or verl's multi-turn defaults without SFT."""
    if "sft" in state.configs:
        return state.configs["sft"].data
    rl = target.run.spec.rl
    overrides = {
        "data.multiturn.enable": True,
        "data.multiturn.messages_key": "messages",
        "data.multiturn.tools_key": "tools",
        "data.max_length": rl.max_prompt_length + rl.max_response_length,
        "data.truncation": "right",
    }
    return compose_verl("sft_trainer", hydra_overrides(overrides)).data


def scripted_episodes(state: State, target: Plan, stage: str, tokenizer: Any, prompts: Sequence[Prompt], tools: Sequence[Any], work_dir: Path) -> list[episodes.Episode]:
    problems = [(p.question, p.ground_truth) for p in prompts]
    with_tool = target.uses_tools
    path = episodes.write_conversations(work_dir / stage / "episodes.parquet", problems, tools=tool_schemas(tools), with_tool=with_tool)
    dataset = create_sft_dataset([str(path)], episode_data_config(state, target), tokenizer)
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
) -> None:
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
        scripted = scripted_episodes(state, target, stage, tokenizer, prompts, tools.get(stage, []), options.work_dir)
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
        rollout = InProcessRollout(config, server)
    except Exception as exc:
        state.add(CheckResult("rollout", stage, "failed", f"verl's agent-loop worker could not be built: {error_text(exc)}"))
        state.skip("trainer-batch", stage, f"needs rollout[{stage}], which failed")
        return
    with rollout:
        recorder = RecordingRollout(rollout)
        try:
            trainer = build_trainer(config, tokenizer, stage_data.train, one_per_source(stage_data.val, stage_data.val_prompts), recorder)
        except Exception as exc:
            state.add(CheckResult("rollout", stage, "skipped", "needs the trainer"))
            state.add(CheckResult("trainer-batch", stage, "failed", f"RayPPOTrainer could not be built as main_ppo builds it: {error_text(exc)}"))
            return
        flows: list[tuple[str, Callable[[], Any]]] = []
        if stage == "rl":
            rows = step_rows(stage_data.train_prompts, int(config.actor_rollout_ref.rollout.n), int(config.actor_rollout_ref.rollout.agent.num_workers))
            flows.append(("training step", lambda: training_step(trainer, stage_data.train, rows)))
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
        summary = f"{' and '.join(details['flows'])} joined, scored and summarised the rollouts as RayPPOTrainer does"
        state.add(CheckResult("trainer-batch", stage, "passed", summary, batch_details))


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
