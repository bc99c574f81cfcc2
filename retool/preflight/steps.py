"""The preflight's steps: each runs one kind of check for the stages that need it and records the result.

The steps share a :class:`State` (results so far, composed configs). Each asks the state whether
what it needs passed; if not it records ``skipped`` with the reason and returns nothing, so later
steps skip in turn. The checks themselves live in ``sft``, ``data``, ``tools``, ``reward`` and
``rollout``; this module wires them to the run's stages on verl 0.6.1. The ``sft-data``, ``rollout``
and ``trainer-batch`` steps are the line-neutral ones of :mod:`retool.preflight.flow`, given verl
0.6.1's pieces as :data:`LINE_06`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from verl import DataProto
from verl.trainer.ppo.utils import need_critic
from verl.utils import hf_tokenizer
from verl.utils.config import validate_config
from verl.utils.dataset.rl_dataset import collate_fn

from retool.data.schema import TEXT_AGENT_NAME, code_interpreter_tool
from retool.preflight import episodes, flow
from retool.preflight.agent import InProcessRollout
from retool.preflight.checks import CheckResult
from retool.preflight.data import check_eval_data, check_rl_data, first_prompts
from retool.preflight.flow import Line, StageData, State, error_text, groups, timed
from retool.preflight.plan import PPO_STAGES, Plan, PreflightOptions
from retool.preflight.reward import AGENT_LOOP_COLUMNS, check_reward
from retool.preflight.sandbox_probe import TEXT_ONLY_SANDBOX, check_sandbox
from retool.preflight.sft import fsdp_sft_dataset, plain
from retool.preflight.tokenizer_files import tokenizer_source_problem
from retool.preflight.tools import check_tools
from retool.preflight.trainer import build_trainer, training_step
from retool.preflight.verl_config import VALIDATION_DIR_KEY, compose_stage, preflight_overrides, stage_files
from retool.recipe.tool.config import TOOL_NAME

__all__ = ["LINE_06", "StageData", "State", "error_text", "groups", "timed"]

logger = logging.getLogger(__name__)


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


# ------------------------------------------------------------------------------ data, tools, reward


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


LINE_06 = Line(
    verl="verl 0.6.1",
    create_sft_dataset=fsdp_sft_dataset,
    sft_config="sft_trainer",
    sft_multiturn={"data.multiturn.enable": True, "data.multiturn.messages_key": "messages", "data.multiturn.tools_key": "tools"},
    rollout=InProcessRollout,
    build_trainer=build_trainer,
    training_step=training_step,
)


def sft_check(state: State, target: Plan, options: PreflightOptions, tokenizer: Any) -> Any:
    return flow.sft_check(state, target, options, tokenizer, LINE_06)


def rollout_checks(state: State, target: Plan, stage: str, config: DictConfig, options: PreflightOptions, **kwargs: Any) -> None:
    flow.rollout_checks(state, target, stage, config, options, line=LINE_06, **kwargs)
