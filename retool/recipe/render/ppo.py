"""Renderers of the verl ``main_ppo`` stages: multi-turn tool RL, and the validation-only eval.

Both share one override set (``ppo_overrides``) because verl checks the training settings even
for a validation-only run; eval then changes the model, the sampling and the output.
"""

from __future__ import annotations

import posixpath
from typing import Any

from retool.recipe.render import ascend
from retool.recipe.render.command import LATEST, RenderError, StageCommand, hydra_overrides
from retool.recipe.render.common import (
    DATASET_CLASS,
    MAX_CHECKPOINTS_KEPT,
    PPO_MODULE,
    PYTHON,
    REWARD_FUNCTION,
    attempt_dir,
    experiment_name,
    loggers,
    model_path,
    model_source_notes,
    process_env,
    stage_run_name,
    tool_config_file,
)
from retool.recipe.render.profiles import engine_profile
from retool.recipe.render.sft import merge_argv
from retool.recipe.verl_plugins import AGENT_LOOP_CONFIG, SINGLE_TURN_AGENT, TOOL_AGENT
from retool.runtime.context import StageContext
from retool.runtime.paths import run_paths
from retool.spec.model import RetoolRun

RUNTIME_ENV_PREFIX = "+ray_kwargs.ray_init.runtime_env.env_vars."
"""Keys rendered with Hydra's ``+`` (add a key verl's schema leaves open): environment of every Ray
worker of the job, which on other nodes does not inherit the driver's environment."""

REWARD_KWARGS_PREFIX = "+custom_reward_function.reward_kwargs."
"""The other ``+`` keys: keyword arguments verl's ``get_custom_reward_fn`` passes to ``compute_score``
(verl's schema has no ``reward_kwargs`` entry; it reads the key when present)."""

WATCH_PREFIX = "+retool.reward_watch."
"""Our own keys in verl's config, read by the trainer's reward watch (``retool.recipe.verl_plugins.watch``)."""
SANDBOX_FAILURE_SHARE_KEY = "+retool.sandbox_failures.max_share"
"""``rl.maxSandboxFailureShare``, read by the trainer's masking (``retool.recipe.verl_plugins.masking``)."""

GAE = "gae"


def policy_model_path(run: RetoolRun) -> str:
    """Where RL starts: the merged SFT model, or the base model when SFT is disabled."""
    return run_paths(run).sft_merged if run.spec.sft.enabled else model_path(run)


def final_model_path(run: RetoolRun) -> str:
    """What eval evaluates: the merged RL model, else the SFT model, else the base model."""
    return run_paths(run).rl_merged if run.spec.rl.enabled else policy_model_path(run)


def ppo_overrides(run: RetoolRun, ctx: StageContext, stage: str, model_path: str) -> dict[str, Any]:
    spec, paths, profile = run.spec, run_paths(run), engine_profile(run.spec)
    rl, hw = spec.rl, spec.hardware
    actor_tokens = (rl.max_prompt_length + rl.max_response_length) * profile.actor_token_factor
    log_prob_tokens = actor_tokens * profile.log_prob_token_factor
    advantage = "grpo" if rl.algorithm == "grpo" else GAE
    max_turns = rl.max_turns if stage == "rl" else (spec.eval.max_turns or rl.max_turns)
    arr = "actor_rollout_ref"
    o: dict[str, Any] = {
        "algorithm.adv_estimator": advantage,
        "algorithm.use_kl_in_reward": rl.use_kl_in_reward,
        "algorithm.kl_ctrl.kl_coef": rl.kl_coef,
        "data.train_files": paths.rl_train,
        "data.val_files": [paths.eval_set(d.name) for d in spec.data.eval],
        "data.return_raw_chat": True,
        "data.train_batch_size": rl.batch_size,
        "data.max_prompt_length": rl.max_prompt_length,
        "data.max_response_length": rl.max_response_length,
        "data.filter_overlong_prompts": True,
        "data.truncation": "error",
        "data.custom_cls.path": DATASET_CLASS[0],
        "data.custom_cls.name": DATASET_CLASS[1],
        "custom_reward_function.path": REWARD_FUNCTION[0],
        "custom_reward_function.name": REWARD_FUNCTION[1],
        f"{arr}.model.path": model_path,
        f"{arr}.model.trust_remote_code": spec.model.trust_remote_code,
        f"{arr}.model.use_remove_padding": True,
        f"{arr}.model.enable_gradient_checkpointing": True,
        f"{arr}.actor.optim.lr": rl.learning_rate,
        f"{arr}.actor.ppo_mini_batch_size": rl.mini_batch_size,
        f"{arr}.actor.use_dynamic_bsz": rl.dynamic_batch_size,
        f"{arr}.actor.ppo_max_token_len_per_gpu": actor_tokens,
        f"{arr}.actor.ulysses_sequence_parallel_size": rl.sequence_parallel,
        f"{arr}.actor.clip_ratio_low": rl.clip_ratio_low,
        f"{arr}.actor.clip_ratio_high": rl.clip_ratio_high,
        f"{arr}.actor.clip_ratio_c": rl.clip_ratio_c,
        f"{arr}.actor.entropy_coeff": rl.entropy_coeff,
        f"{arr}.actor.use_kl_loss": rl.use_kl_loss,
        f"{arr}.actor.kl_loss_coef": rl.kl_loss_coef,
        f"{arr}.actor.fsdp_config.param_offload": rl.offload,
        f"{arr}.actor.fsdp_config.optimizer_offload": rl.offload,
        f"{arr}.ref.log_prob_max_token_len_per_gpu": log_prob_tokens,
        f"{arr}.ref.fsdp_config.param_offload": profile.ref_param_offload,
        f"{arr}.rollout.name": rl.rollout_engine,
        f"{arr}.rollout.mode": "async",
        f"{arr}.rollout.tensor_model_parallel_size": rl.tensor_parallel,
        f"{arr}.rollout.gpu_memory_utilization": rl.gpu_memory_utilization,
        f"{arr}.rollout.max_num_batched_tokens": rl.max_prompt_length + rl.max_response_length,
        f"{arr}.rollout.max_num_seqs": profile.rollout_max_num_seqs,
        f"{arr}.rollout.enable_chunked_prefill": True,
        f"{arr}.rollout.enforce_eager": profile.enforce_eager,
        f"{arr}.rollout.log_prob_max_token_len_per_gpu": log_prob_tokens,
        f"{arr}.rollout.n": rl.rollout_n,
        f"{arr}.rollout.temperature": rl.temperature,
        f"{arr}.rollout.top_p": rl.top_p,
        f"{arr}.rollout.val_kwargs.n": spec.eval.samples_per_problem,
        f"{arr}.rollout.val_kwargs.temperature": spec.eval.temperature,
        f"{arr}.rollout.val_kwargs.top_p": spec.eval.top_p,
        f"{arr}.rollout.val_kwargs.do_sample": spec.eval.temperature > 0,
        **_rollout_loop(run, ctx, stage, max_turns),
        f"{arr}.rollout.agent.num_workers": profile.agent_workers,
        "trainer.logger": loggers(ctx),
        "trainer.project_name": experiment_name(run, ctx),
        "trainer.experiment_name": stage_run_name(ctx, stage),
        "trainer.nnodes": hw.nodes,
        "trainer.n_gpus_per_node": hw.devices_per_node,
        "trainer.log_val_generations": rl.log_val_generations,
    }
    if not rl.dynamic_batch_size:
        # Without token-based packing verl needs explicit micro-batches.
        o[f"{arr}.actor.ppo_micro_batch_size_per_gpu"] = 1
        o[f"{arr}.ref.log_prob_micro_batch_size_per_gpu"] = 1
        o[f"{arr}.rollout.log_prob_micro_batch_size_per_gpu"] = 1
    if advantage == GAE:
        o.update(_critic_overrides(run, model_path, actor_tokens))
    if hw.accelerator == "ascend":
        o.update(ascend.ppo_overrides())
    for key, value in process_env(run, ctx).items():
        o[RUNTIME_ENV_PREFIX + key] = value
    watch = rl.reward_watch
    o.update({f"{WATCH_PREFIX}{key}": value for key, value in watch.model_dump(by_alias=False).items()})
    o[f"{WATCH_PREFIX}horizon"] = rl.steps  # RewardSuspect's false-alarm bound covers the whole run
    o[SANDBOX_FAILURE_SHARE_KEY] = rl.max_sandbox_failure_share
    return o


def uses_tools(run: RetoolRun) -> bool:
    """ReTool's rollouts call the code interpreter; the text-only baseline's never do."""
    return run.spec.recipe == "tool-integrated"


def _rollout_loop(run: RetoolRun, ctx: StageContext, stage: str, max_turns: int) -> dict[str, Any]:
    """The agent loop: multi-turn with the code interpreter, or (text-only) one plain generation.

    The text-only baseline renders no tool config at all: verl's ``single_turn_agent`` loop applies
    the chat template without tools (the prepared rows route to it too), so neither the prompt nor
    the rollout mentions a tool, and the reward is the same +1/-1 on the final answer.
    """
    arr = "actor_rollout_ref"
    if not uses_tools(run):
        return {f"{arr}.rollout.multi_turn.enable": False, f"{arr}.rollout.agent.default_agent_loop": SINGLE_TURN_AGENT}
    tool_path, _ = tool_config_file(run, ctx, stage)
    return {
        f"{arr}.rollout.multi_turn.enable": True,
        f"{arr}.rollout.multi_turn.format": "hermes",
        f"{arr}.rollout.multi_turn.max_user_turns": max_turns,
        f"{arr}.rollout.multi_turn.max_assistant_turns": max_turns,
        f"{arr}.rollout.multi_turn.tool_config_path": tool_path,
        f"{arr}.rollout.multi_turn.max_tool_response_length": run.spec.rl.tool_response_max_chars,
        # Keep the head and the tail of long interpreter output (tracebacks end at the bottom).
        f"{arr}.rollout.multi_turn.tool_response_truncate_side": "middle",
        f"{arr}.rollout.agent.default_agent_loop": TOOL_AGENT,
        f"{arr}.rollout.agent.agent_loop_config_path": AGENT_LOOP_CONFIG,
    }


def _tool_files(run: RetoolRun, ctx: StageContext, stage: str) -> dict[str, str]:
    if not uses_tools(run):
        return {}
    path, content = tool_config_file(run, ctx, stage)
    return {path: content}


def _critic_overrides(run: RetoolRun, model_path: str, actor_tokens: int) -> dict[str, Any]:
    rl = run.spec.rl
    o: dict[str, Any] = {
        "critic.enable": True,
        "critic.model.path": model_path,
        "critic.model.trust_remote_code": run.spec.model.trust_remote_code,
        "critic.model.use_remove_padding": True,
        "critic.model.enable_gradient_checkpointing": True,
        "critic.model.fsdp_config.param_offload": rl.offload,
        "critic.model.fsdp_config.optimizer_offload": rl.offload,
        "critic.optim.lr": rl.critic_learning_rate,
        "critic.ulysses_sequence_parallel_size": rl.sequence_parallel,
        "critic.ppo_max_token_len_per_gpu": actor_tokens * 2,
    }
    if not rl.dynamic_batch_size:
        o["critic.ppo_micro_batch_size_per_gpu"] = 1
    return o


def _enabled_ppo_overrides(run: RetoolRun, ctx: StageContext, stage: str, model_path: str) -> dict[str, Any]:
    """``ppo_overrides`` of ``stage`` (rl or eval), or ``RenderError`` when the spec disables it."""
    if not getattr(run.spec, stage).enabled:
        raise RenderError(f"spec.{stage}.enabled is false: the {stage} stage is skipped")
    return ppo_overrides(run, ctx, stage, model_path)


def _ppo_command(run: RetoolRun, ctx: StageContext, stage: str, overrides: dict[str, Any], **fields: Any) -> StageCommand:
    """A ``main_ppo`` stage: ``overrides`` as its Hydra command line, the tool config file, the stage environment."""
    return StageCommand(
        stage=stage,
        argv=(PYTHON, "-m", PPO_MODULE, *hydra_overrides(overrides)),
        env=process_env(run, ctx),
        files=_tool_files(run, ctx, stage),
        config_name="ppo_trainer",
        overrides=overrides,
        **fields,
    )


def render_rl(run: RetoolRun, ctx: StageContext) -> StageCommand:
    spec, paths = run.spec, run_paths(run)
    overrides = _enabled_ppo_overrides(run, ctx, "rl", policy_model_path(run))
    overrides.update(
        {
            # Enough epochs for any data size; total_training_steps ends the run (and sets the LR schedule).
            "trainer.total_epochs": spec.rl.steps,
            "trainer.total_training_steps": spec.rl.steps,
            "trainer.save_freq": spec.rl.save_freq,
            "trainer.test_freq": spec.rl.test_freq,
            "trainer.val_before_train": spec.rl.val_before_train,
            "trainer.default_local_dir": paths.rl_checkpoints,
            "trainer.resume_mode": "auto",
            "trainer.max_actor_ckpt_to_keep": MAX_CHECKPOINTS_KEPT,
            "trainer.max_critic_ckpt_to_keep": MAX_CHECKPOINTS_KEPT,
        }
    )
    if spec.rl.tool_turn_shaping:
        # verl's recipe option: a wrong answer earns 0.1 per tool call (capped at -0.6). Training only:
        # the eval stage keeps the paper's +1/-1 reward.
        overrides[REWARD_KWARGS_PREFIX + "tool_turn_shaping"] = True
    if spec.rl.rollout_traces:
        overrides["actor_rollout_ref.rollout.trace.backend"] = "mlflow"
        overrides["actor_rollout_ref.rollout.trace.token2text"] = True
    notes = ("a retry resumes from the latest checkpoint in trainer.default_local_dir (resume_mode=auto)",)
    if not uses_tools(run):
        notes += ("recipe text-only: no code interpreter, no sandbox (single-turn rollouts)",)
    if not spec.sft.enabled:
        notes += model_source_notes(run)
    return _ppo_command(run, ctx, "rl", overrides, notes=notes)


def render_eval(run: RetoolRun, ctx: StageContext) -> StageCommand:
    spec, paths = run.spec, run_paths(run)
    overrides = _enabled_ppo_overrides(run, ctx, "eval", final_model_path(run))
    overrides.update(
        {
            "trainer.val_only": True,
            # verl validates only through the pre-training validation, even in val_only mode.
            "trainer.val_before_train": True,
            "trainer.total_epochs": 1,
            "trainer.resume_mode": "disable",
            # Never written (resume disabled, no training step); kept away from the RL checkpoints.
            "trainer.default_local_dir": posixpath.join(attempt_dir(paths, "eval", ctx.attempt), "no-checkpoints"),
            # Every sample as JSON lines (input, output, gts, score, acc, pred, ...) in <eval_output>/0.jsonl.
            "trainer.validation_data_dir": paths.eval_output,
        }
    )
    pre: tuple[tuple[str, ...], ...] = ()
    source: tuple[str, str] | None = None
    notes: list[str] = [f"per-sample results: {posixpath.join(paths.eval_output, '0.jsonl')}"]
    if not spec.sft.enabled and not spec.rl.enabled:
        notes.extend(model_source_notes(run))
    if spec.rl.enabled:
        source = (paths.rl_checkpoints, "actor")
        pre = (merge_argv(posixpath.join(paths.rl_checkpoints, f"global_step_{LATEST}", "actor"), paths.rl_merged, run),)
        notes.insert(0, f"first merges the latest RL checkpoint ({LATEST} from {paths.rl_checkpoints}/latest_checkpointed_iteration.txt) into {paths.rl_merged}")
    return _ppo_command(run, ctx, "eval", overrides, pre=pre, notes=tuple(notes), checkpoint_source=source)
