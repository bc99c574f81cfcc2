"""The preflight of a run on the 0.9 line (``spec.trainer.verl: "0.9.1"``), on verl 0.9.1's own code.

The 0.6 preflight (:mod:`retool.preflight.runner`) drives verl 0.6.1's internals (``fsdp_sft_trainer``,
``AgentLoopWorkerBase``, ``RewardManagerWorker``, ``compute_reward``), which verl 0.9.1 removed. On
this line the preflight runs the checks whose verl 0.9.1 counterpart is ported, each on verl
0.9.1's code with the stage's composed config:

- ``tokenizer``: it loads and has a chat template (one that renders the tool schema, for tools);
- ``config``: every rendered stage composes in struct mode; ``validate_config`` on the PPO stages;
- ``reward-guard``: verl 0.9.1's ``load_reward_manager`` calls our reward, with the rendered kwargs;
- ``tools``: verl 0.9.1's ``load_all_tools`` builds ``code_interpreter`` from the rendered config;
- ``rl-data``/``eval-data``: verl 0.9.1's ``create_rl_dataset`` builds our dataset class and keeps
  prompts (at least one batch for RL);
- ``reward``: the function verl loads scores a right answer above a wrong one per data source;
- ``model``: the model's shape against the run's hardware and its tokenizer (verl-free, as on 0.6.1);
- ``sandbox``: the run's sandbox answers and code run through the tool verl 0.9.1 built prints what it
  should (:mod:`retool.preflight.sandbox_probe`, shared with 0.6.1);
- ``sft-data``: the SFT file through verl 0.9.1's own SFT dataset, the one ``sft_trainer`` builds on
  ``sft_trainer_engine`` (``create_sft_dataset`` in ``verl/trainer/sft_trainer.py``, building
  ``MultiTurnSFTDataset``), checked by :func:`retool.preflight.sft.check_sft` as on 0.6.1 (lengths
  against ``sft.maxLength``, loss mask on assistant tokens only, tool calls the rollout's parser reads);
- ``rollout``: scripted rollouts (the turns verl 0.9.1's SFT dataset trains on, replayed by a scripted
  model server) through verl 0.9.1's ``AgentLoopWorker`` with our agent loop and tool, the run's
  sandbox and an in-process ``RewardLoopWorker`` (:mod:`retool.preflight.agent09`);
- ``trainer-batch``: a training step's batch assembled as verl 0.9.1's ``RayPPOTrainer.fit`` does and
  the trainer's own ``_validate`` (:mod:`retool.preflight.trainer09`).

The last three are the 0.6 line's checks (:mod:`retool.preflight.flow`), given verl 0.9.1's pieces as
:data:`LINE_09`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig

from retool.preflight import flow, trainer09
from retool.preflight.agent09 import InProcessRollout09
from retool.preflight.checks import CheckResult
from retool.preflight.data import first_prompts
from retool.preflight.flow import Line, StageData, State
from retool.preflight.model import check_model
from retool.preflight.plan import PPO_STAGES, Plan, PreflightOptions
from retool.preflight.report import Report
from retool.preflight.reward import leaves_no_reward_loaded
from retool.preflight.reward_guard import check_reward_guard, expected_reward_kwargs
from retool.preflight.reward_watch import reward_watch_check
from retool.preflight.sandbox_probe import TEXT_ONLY_SANDBOX, check_sandbox
from retool.preflight.verl_config import compose_stage, preflight_overrides, stage_files
from retool.recipe.render.v0_9 import sft_overrides
from retool.recipe.tool.config import TOOL_NAME

logger = logging.getLogger(__name__)

WRONG = "preflight-not-the-answer"
CHECK_ORDER = ("tokenizer", "model", "config", "sft-data", "reward-guard", "tools", "sandbox", "rl-data", "eval-data", "reward", "reward-watch", "rollout", "trainer-batch")


def engine_sft_dataset(files: Any, data: DictConfig, tokenizer: Any, max_samples: int = -1) -> Any:
    """verl 0.9.1's SFT dataset as ``SFTTrainer._build_dataset`` builds it (``verl/trainer/sft_trainer.py``; no processor for a text model)."""
    from verl.trainer.sft_trainer import create_sft_dataset

    return create_sft_dataset(files, data, tokenizer, None, max_samples=max_samples)


LINE_09 = Line(
    verl="verl 0.9.1",
    create_sft_dataset=engine_sft_dataset,
    sft_config="sft_trainer_engine",
    # The 0.6 keys as the 0.9 line's SFT render moves them (and what it adds: data.ignore_input_ids_mismatch).
    sft_multiturn=sft_overrides({"data.multiturn.enable": True, "data.multiturn.messages_key": "messages", "data.multiturn.tools_key": "tools"}),
    rollout=InProcessRollout09,
    build_trainer=trainer09.build_trainer,
    training_step=trainer09.training_step,
    trainer_scope=trainer09.trainer_scope,
)


def _guarded(results: list[CheckResult], check: str, scope: str, body: Callable[[], CheckResult]) -> CheckResult:
    try:
        result = body()
    except Exception as exc:  # a finding of the run, reported; never a crash of the preflight
        result = CheckResult(check, scope, "failed", f"{type(exc).__name__}: {exc}")
    results.append(result)
    return result


def _tokenizer(options: PreflightOptions, run: Any, tools: bool) -> tuple[CheckResult, Any]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(options.tokenizer, trust_remote_code=run.spec.model.trust_remote_code)
    if not getattr(tokenizer, "chat_template", None):
        return CheckResult("tokenizer", "run", "failed", f"{options.tokenizer} has no chat template"), None
    if tools:
        from retool.recipe.tool.config import code_interpreter_tool

        text = tokenizer.apply_chat_template([{"role": "user", "content": "1+1?"}], tools=[code_interpreter_tool()], tokenize=False, add_generation_prompt=True)
        if TOOL_NAME not in text:
            return CheckResult("tokenizer", "run", "failed", "the chat template does not render the code_interpreter schema"), None
    return CheckResult("tokenizer", "run", "passed", f"{type(tokenizer).__name__} with a chat template"), tokenizer


def _config(command: Any, options: PreflightOptions) -> tuple[CheckResult, DictConfig]:
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    if command.config_name == "ppo_trainer":
        copies = stage_files(command, options.work_dir)
        config = compose_stage(command, preflight_overrides(command, tokenizer=options.tokenizer, file_copies=copies, work_dir=options.work_dir))
        validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    else:
        config = compose_stage(command)
    return CheckResult("config", command.stage, "passed", f"{len(command.overrides)} rendered overrides compose into verl 0.9.1's {command.config_name}"), config


def _tools(config: DictConfig, scope: str, built: list[Any]) -> CheckResult:
    """``tools``; the tools verl built go into ``built`` for the sandbox check."""
    from verl.tools.tool_registry import load_all_tools

    path = config.actor_rollout_ref.rollout.multi_turn.get("tool_config_path")
    tools = load_all_tools(tool_config_path=str(path), function_tool_path=None)
    names = sorted(tool.name for tool in tools)
    if TOOL_NAME not in names:
        return CheckResult("tools", scope, "failed", f"verl built {names}, not {TOOL_NAME}")
    built.extend(tools)
    return CheckResult("tools", scope, "passed", f"verl 0.9.1's registry built {', '.join(names)}")


def _data(config: DictConfig, tokenizer: Any, scope: str) -> tuple[list[CheckResult], Any, Any]:
    from verl.trainer.ppo.utils import create_rl_dataset

    results = []
    train = create_rl_dataset(config.data.train_files, config.data, tokenizer, None, is_train=True)
    batches = len(train) // int(config.data.train_batch_size)
    status = "passed" if batches >= 1 else "failed"
    results.append(CheckResult("rl-data", scope, status, f"{len(train)} RL prompts kept ({batches} full batches of {config.data.train_batch_size})", {"kept": len(train)}))
    val = create_rl_dataset(config.data.val_files, config.data, tokenizer, None, is_train=False)
    results.append(CheckResult("eval-data", scope, "passed" if len(val) else "failed", f"{len(val)} eval prompts kept", {"kept": len(val)}))
    return results, train, val


def _reward(config: DictConfig, scope: str, dataset: Any) -> CheckResult:
    from verl.trainer.ppo.reward import get_custom_reward_fn

    function = get_custom_reward_fn(config)
    if function is None:
        return CheckResult("reward", scope, "failed", "reward.custom_reward_function.path is not set: verl 0.9.1 would score with its default")
    frame = dataset.dataframe
    sources: dict[str, str] = {}
    for i in range(len(frame)):
        row = frame[i]
        sources.setdefault(row["data_source"], str(row["reward_model"]["ground_truth"]))
    scores = {}
    for source, truth in sources.items():
        right = function(data_source=source, solution_str=f"So the answer is \\boxed{{{truth}}}.", ground_truth=truth, extra_info={})
        wrong = function(data_source=source, solution_str=f"So the answer is \\boxed{{{WRONG}}}.", ground_truth=truth, extra_info={})
        value = lambda r: float(r["score"] if isinstance(r, dict) else r)  # noqa: E731
        scores[source] = (value(right), value(wrong))
    bad = [s for s, (right, wrong) in scores.items() if not right > wrong]
    if bad:
        return CheckResult("reward", scope, "failed", f"a right answer does not outscore a wrong one for {', '.join(bad)}", {"scores": scores})
    return CheckResult("reward", scope, "passed", ", ".join(f"{s}: right {r:g}, wrong {w:g}" for s, (r, w) in scores.items()), {"scores": scores})


def right_score(result: CheckResult) -> float | None:
    """The score of a right answer when every data source gives the same one (what each scripted rollout must score)."""
    rights = {right for right, _ in result.details.get("scores", {}).values()}
    return rights.pop() if len(rights) == 1 else None


@leaves_no_reward_loaded
def run_preflight(target: Plan, options: PreflightOptions) -> Report:
    """The 0.9 line's checks of ``target`` (see the module docstring); findings are results, never exceptions."""
    started = time.monotonic()
    options.work_dir.mkdir(parents=True, exist_ok=True)
    state = State()
    results = state.results
    tokenizer: Any = None
    try:
        result, tokenizer = _tokenizer(options, target.run, target.uses_tools)
    except Exception as exc:
        result = CheckResult("tokenizer", "run", "failed", f"{type(exc).__name__}: {exc}")
    results.append(result)
    _guarded(results, "model", "run", lambda: check_model(target.run.spec, options.tokenizer, tokenizer))
    for stage, command in target.commands.items():
        holder: dict[str, DictConfig] = {}

        def compose(command: Any = command, holder: dict[str, DictConfig] = holder) -> CheckResult:
            result, holder["config"] = _config(command, options)
            return result

        if _guarded(results, "config", stage, compose).status == "passed":
            state.configs[stage] = holder["config"]
    flow.sft_check(state, target, options, tokenizer, LINE_09)
    ppo = {stage: state.configs[stage] for stage in PPO_STAGES if stage in state.configs}
    for stage, config in ppo.items():
        results.append(check_reward_guard(config, stage, expected_reward_kwargs(target.commands[stage].overrides)))
    data: dict[str, StageData] = {}
    tools: dict[str, list[Any]] = {}
    right_scores: dict[str, float] = {}
    for stage, config in ppo.items():
        if target.uses_tools:
            built: list[Any] = []
            if _guarded(results, "tools", stage, lambda config=config, stage=stage, built=built: _tools(config, stage, built)).status == "passed":
                if _guarded(results, "sandbox", stage, lambda stage=stage, built=built: check_sandbox(built, stage, wait_s=options.sandbox_wait_s)).status == "passed":
                    tools[stage] = built
            else:
                results.append(CheckResult("sandbox", stage, "skipped", f"needs tools[{stage}], which failed"))
        else:
            results.append(CheckResult("sandbox", stage, "skipped", TEXT_ONLY_SANDBOX))
        if tokenizer is None:
            results += [CheckResult(check, stage, "skipped", "needs the tokenizer, which did not load") for check in ("rl-data", "eval-data", "reward")]
            continue
        try:
            found, train, val = _data(config, tokenizer, stage)
        except Exception as exc:
            results.append(CheckResult("rl-data", stage, "failed", f"verl 0.9.1's create_rl_dataset: {type(exc).__name__}: {exc}"))
            results.append(CheckResult("reward", stage, "skipped", "needs prompts, which did not load"))
            continue
        results += found
        if len(train) and len(val):
            data[stage] = StageData(train, val, first_prompts(train), first_prompts(val))
        reward = _guarded(results, "reward", stage, lambda config=config, stage=stage, val=val: _reward(config, stage, val))
        right = right_score(reward) if reward.status == "passed" else None
        if right is not None:
            right_scores[stage] = right
    if "rl" in ppo:
        results.append(reward_watch_check(target, ppo["rl"], state.blocked("rl", ["config", "rl-data", "reward"])))
    for stage, config in ppo.items():
        flow.rollout_checks(state, target, stage, config, options, tokenizer=tokenizer, data=data, tools=tools, right_scores=right_scores, line=LINE_09)
    order = {name: i for i, name in enumerate(CHECK_ORDER)}
    results.sort(key=lambda r: order.get(r.check, len(order)))
    report = Report(
        run=target.run.metadata.name,
        namespace=target.ctx.namespace,
        stages=tuple(target.commands),
        tokenizer=options.tokenizer,
        recipe=target.run.spec.recipe,
        sandbox_url=target.ctx.sandbox_url if target.uses_tools else None,
        results=tuple(results),
        seconds=time.monotonic() - started,
        facts={**state.facts, "verl_line": "0.9.1"},
    )
    logger.info("preflight (0.9 line) of %s/%s %s in %.1f s", report.namespace, report.run, "passed" if report.passed else "FAILED", report.seconds)
    return report
