"""Run every preflight check of a plan, in dependency order, and build the report.

A check whose inputs failed is skipped, naming them; everything else still runs, so one preflight
shows every problem it can see. Work that two stages share (their data config, tool config,
reward function) is checked once, under both scopes (``rl+eval``).
"""

from __future__ import annotations

import logging
import time

from retool.preflight import steps
from retool.preflight.model import check_model
from retool.preflight.plan import PPO_STAGES, Plan, PreflightOptions
from retool.preflight.report import Report
from retool.preflight.reward import leaves_no_reward_loaded
from retool.preflight.reward_guard import check_reward_guard, expected_reward_kwargs
from retool.preflight.reward_watch import reward_watch_check

logger = logging.getLogger(__name__)


@leaves_no_reward_loaded
def run_preflight(target: Plan, options: PreflightOptions) -> Report:
    """Every check of ``target``; a finding is a failed check in the report, never an exception."""
    started = time.monotonic()
    options.work_dir.mkdir(parents=True, exist_ok=True)
    state = steps.State()
    tokenizer = steps.tokenizer_check(state, options, trust_remote_code=target.run.spec.model.trust_remote_code, tools=target.uses_tools)
    state.add(check_model(target.run.spec, options.tokenizer, tokenizer))
    steps.config_checks(state, target, options)
    sft_dataset = steps.sft_check(state, target, options, tokenizer)
    ppo = {stage: state.configs[stage] for stage in PPO_STAGES if stage in state.configs}
    for stage, config in ppo.items():  # never skipped: the reward verl calls must be ours, on either verl line
        state.add(check_reward_guard(config, stage, expected_reward_kwargs(target.commands[stage].overrides)))
    data = steps.data_checks(state, target, ppo, tokenizer)
    tools = steps.tool_checks(state, target, ppo, options, sft_dataset)
    right_scores = steps.reward_checks(state, target, ppo, data)
    if "rl" in ppo:
        state.add(reward_watch_check(target, ppo["rl"], state.blocked("rl", ["config", "rl-data", "reward"])))
    for stage, config in ppo.items():
        steps.rollout_checks(state, target, stage, config, options, tokenizer=tokenizer, data=data, tools=tools, right_scores=right_scores)
    report = Report(
        run=target.run.metadata.name,
        namespace=target.ctx.namespace,
        stages=tuple(target.commands),
        tokenizer=options.tokenizer,
        recipe=target.run.spec.recipe,
        sandbox_url=target.ctx.sandbox_url if target.uses_tools else None,
        results=tuple(state.results),
        seconds=time.monotonic() - started,
        facts=state.facts,
    )
    logger.info("preflight of %s/%s %s in %.1f s", report.namespace, report.run, "passed" if report.passed else "FAILED", report.seconds)
    return report
