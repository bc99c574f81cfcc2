"""What each stage renders, checked setting by setting against the spec and the public recipes."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from retool.recipe.render.ascend import ASCEND_ENV
from retool.recipe.render.command import LATEST, RenderError
from retool.recipe.render.stages import enabled_stages, render_stage
from retool.recipe.tool.config import TOOL_CLASS
from retool.runtime.context import StageContext
from retool.runtime.paths import run_paths
from tests.render.cases import context_of, run_of

ARR = "actor_rollout_ref"
RAY_TORCHRUN = ("python3", "-m", "retool.runtime.ray_torchrun", "--nodes", "2", "--devices-per-node", "8")

# (variant, stage, override key, expected value)
SETTINGS: list[tuple[str, str, str, Any]] = [
    # the 32B recipe (run_qwen2-32b_sft.sh / run_qwen2-32b_dapo.sh)
    ("qwen32b-h200", "sft", "data.multiturn.enable", True),
    ("qwen32b-h200", "sft", "data.multiturn.messages_key", "messages"),
    ("qwen32b-h200", "sft", "data.multiturn.tools_key", "tools"),
    ("qwen32b-h200", "sft", "data.max_length", 16384),
    ("qwen32b-h200", "sft", "data.micro_batch_size_per_gpu", 4),
    ("qwen32b-h200", "sft", "ulysses_sequence_parallel_size", 4),
    ("qwen32b-h200", "sft", "use_remove_padding", True),
    ("qwen32b-h200", "sft", "trainer.total_epochs", 6),
    ("qwen32b-h200", "sft", "optim.lr", 1e-5),
    ("qwen32b-h200", "sft", "trainer.default_local_dir", "/data/retool/qwen32b-h200/checkpoints/sft"),
    ("qwen32b-h200", "sft", "trainer.logger", ["console", "mlflow"]),
    ("qwen32b-h200", "sft", "model.strategy", "fsdp"),
    # Ascend SFT: FSDP1, what the public Ascend scripts and verl's Ascend support table use
    ("qwen7b-ascend", "sft", "model.strategy", "fsdp"),
    ("qwen7b-ascend-two-nodes", "sft", "model.strategy", "fsdp"),
    ("qwen7b-ascend", "sft", "trainer.max_ckpt_to_keep", 2),
    ("qwen32b-h200", "rl", "algorithm.adv_estimator", "grpo"),
    ("qwen32b-h200", "rl", "data.train_batch_size", 512),
    ("qwen32b-h200", "rl", f"{ARR}.actor.ppo_mini_batch_size", 64),
    ("qwen32b-h200", "rl", f"{ARR}.rollout.n", 16),
    ("qwen32b-h200", "rl", f"{ARR}.rollout.tensor_model_parallel_size", 4),
    ("qwen32b-h200", "rl", f"{ARR}.actor.ulysses_sequence_parallel_size", 8),
    ("qwen32b-h200", "rl", f"{ARR}.actor.ppo_max_token_len_per_gpu", 2048 + 16384),
    ("qwen32b-h200", "rl", f"{ARR}.ref.log_prob_max_token_len_per_gpu", (2048 + 16384) * 4),
    ("qwen32b-h200", "rl", f"{ARR}.actor.clip_ratio_low", 0.2),
    ("qwen32b-h200", "rl", f"{ARR}.actor.clip_ratio_high", 0.28),
    ("qwen32b-h200", "rl", f"{ARR}.actor.clip_ratio_c", 10.0),
    ("qwen32b-h200", "rl", f"{ARR}.actor.fsdp_config.param_offload", True),
    ("qwen32b-h200", "rl", f"{ARR}.actor.use_dynamic_bsz", True),
    ("qwen32b-h200", "rl", f"{ARR}.rollout.mode", "async"),
    ("qwen32b-h200", "rl", f"{ARR}.rollout.name", "vllm"),
    ("qwen32b-h200", "rl", f"{ARR}.rollout.gpu_memory_utilization", 0.9),
    ("qwen32b-h200", "rl", f"{ARR}.rollout.multi_turn.format", "hermes"),
    ("qwen32b-h200", "rl", f"{ARR}.rollout.multi_turn.max_assistant_turns", 8),
    ("qwen32b-h200", "rl", f"{ARR}.rollout.agent.default_agent_loop", "tool_agent"),
    ("qwen32b-h200", "rl", f"{ARR}.rollout.val_kwargs.n", 30),
    ("qwen32b-h200", "rl", f"{ARR}.rollout.val_kwargs.top_p", 0.6),
    ("qwen32b-h200", "rl", f"{ARR}.model.path", "/data/retool/qwen32b-h200/models/sft"),
    ("qwen32b-h200", "rl", "data.val_files", ["/data/retool/qwen32b-h200/data/eval/aime_2024.parquet", "/data/retool/qwen32b-h200/data/eval/aime_2025.parquet"]),
    ("qwen32b-h200", "rl", "data.custom_cls.name", "RetoolRLDataset"),
    ("qwen32b-h200", "rl", "custom_reward_function.name", "compute_score"),
    ("qwen32b-h200", "rl", "trainer.total_training_steps", 400),
    ("qwen32b-h200", "rl", "trainer.save_freq", 30),
    ("qwen32b-h200", "rl", "trainer.test_freq", 5),
    ("qwen32b-h200", "rl", "trainer.resume_mode", "auto"),
    ("qwen32b-h200", "rl", "trainer.default_local_dir", "/data/retool/qwen32b-h200/checkpoints/rl"),
    ("qwen32b-h200", "rl", "trainer.project_name", "retool/qwen32b-h200"),
    ("qwen32b-h200", "rl", "trainer.experiment_name", "qwen32b-h200-rl-1"),
    ("qwen32b-h200", "rl", "trainer.device", None),
    ("qwen32b-h200", "eval", "trainer.val_only", True),
    ("qwen32b-h200", "eval", "trainer.val_before_train", True),
    ("qwen32b-h200", "eval", "trainer.resume_mode", "disable"),
    ("qwen32b-h200", "eval", "trainer.validation_data_dir", "/data/retool/qwen32b-h200/eval"),
    ("qwen32b-h200", "eval", f"{ARR}.model.path", "/data/retool/qwen32b-h200/models/rl"),
    ("qwen32b-h200", "eval", f"{ARR}.rollout.val_kwargs.temperature", 1.0),
    ("qwen32b-h200", "eval", f"{ARR}.rollout.val_kwargs.do_sample", True),
    # the Ascend recipe (Ascend ReTool best practice, 7B)
    ("qwen7b-ascend", "sft", "trainer.device", "npu"),
    ("qwen7b-ascend", "rl", "trainer.device", "npu"),
    ("qwen7b-ascend", "rl", f"{ARR}.actor.entropy_from_logits_with_chunking", True),
    ("qwen7b-ascend", "rl", f"{ARR}.ref.entropy_from_logits_with_chunking", True),
    ("qwen7b-ascend", "rl", f"{ARR}.actor.entropy_checkpointing", True),
    ("qwen7b-ascend", "rl", f"{ARR}.actor.use_torch_compile", False),
    ("qwen7b-ascend", "rl", f"{ARR}.ref.use_torch_compile", False),
    ("qwen7b-ascend", "rl", f"{ARR}.rollout.tensor_model_parallel_size", 2),
    ("qwen7b-ascend", "rl", f"{ARR}.rollout.max_num_batched_tokens", 2048 + 20480),
    ("qwen7b-ascend", "rl", f"{ARR}.rollout.multi_turn.max_user_turns", 16),
    ("qwen7b-ascend", "rl", "trainer.val_before_train", False),
    ("qwen7b-ascend", "rl", "trainer.save_freq", 100),
    ("qwen7b-ascend", "rl", "trainer.test_freq", 20),
    ("qwen7b-ascend", "eval", "trainer.device", "npu"),
    ("qwen32b-on-ascend", "rl", "trainer.device", "npu"),
    # PPO adds a GAE critic on the same starting model
    ("qwen32b-h200-ppo", "rl", "algorithm.adv_estimator", "gae"),
    ("qwen32b-h200-ppo", "rl", "critic.enable", True),
    ("qwen32b-h200-ppo", "rl", "critic.model.path", "/data/retool/qwen32b-h200/models/sft"),
    ("qwen32b-h200-ppo", "rl", "critic.optim.lr", 1e-5),
    ("qwen32b-h200", "rl", "critic.enable", None),
    # fixed micro-batches when token packing is off
    ("qwen32b-fixed-micro-batches-kl", "rl", f"{ARR}.actor.ppo_micro_batch_size_per_gpu", 1),
    ("qwen32b-fixed-micro-batches-kl", "rl", f"{ARR}.actor.use_kl_loss", True),
    ("qwen32b-fixed-micro-batches-kl", "rl", f"{ARR}.actor.kl_loss_coef", 0.001),
    # rollout traces in MLflow with token-to-text
    ("qwen32b-traces", "rl", f"{ARR}.rollout.trace.backend", "mlflow"),
    ("qwen32b-traces", "rl", f"{ARR}.rollout.trace.token2text", True),
    ("qwen32b-h200", "rl", f"{ARR}.rollout.trace.backend", None),
    # stages skipped: RL starts from the base model, eval evaluates the SFT model
    ("minimal-no-sft", "rl", f"{ARR}.model.path", "/data/default/minimal/models/base"),
    ("minimal-no-sft", "eval", f"{ARR}.model.path", "/data/default/minimal/models/rl"),
    ("minimal-no-rl", "eval", f"{ARR}.model.path", "/data/default/minimal/models/sft"),
]


@pytest.mark.parametrize(("variant", "stage", "key", "expected"), [pytest.param(*row, id=f"{row[0]}-{row[1]}-{row[2]}") for row in SETTINGS])
def test_stage_setting(variant: str, stage: str, key: str, expected: Any) -> None:
    run = run_of(variant)
    overrides = render_stage(run, stage, context_of(run)).overrides
    assert overrides.get(key) == expected


def test_ascend_environment_is_set_for_the_process_and_every_ray_worker() -> None:
    run = run_of("qwen7b-ascend")
    for stage in ("sft", "rl", "eval"):
        command = render_stage(run, stage, context_of(run))
        assert ASCEND_ENV.items() <= command.env.items()
        assert command.env["VLLM_USE_V1"] == "1" and command.env["VLLM_ASCEND_ENABLE_NZ"] == "0"
    rl = render_stage(run, "rl", context_of(run))
    assert rl.overrides["+ray_kwargs.ray_init.runtime_env.env_vars.HCCL_OP_EXPANSION_MODE"] == "AIV"


@pytest.mark.parametrize(("variant", "expected"), [pytest.param("qwen32b-h200", 32, id="256-over-8-workers"), pytest.param("qwen7b-ascend", 16, id="128-over-8-workers")])
def test_sandbox_capacity_is_split_between_the_agent_loop_workers(variant: str, expected: int) -> None:
    run = run_of(variant)
    command = render_stage(run, "rl", context_of(run))
    workers = command.overrides[f"{ARR}.rollout.agent.num_workers"]
    [tool] = yaml.safe_load(next(iter(command.files.values())))["tools"]
    assert tool["config"]["concurrency"] == expected
    assert tool["config"]["concurrency"] * workers <= run.spec.sandbox.max_concurrent


def test_nvidia_gets_no_ascend_environment() -> None:
    run = run_of("qwen32b-h200")
    command = render_stage(run, "rl", context_of(run))
    assert not set(ASCEND_ENV) & set(command.env)


@pytest.mark.parametrize("stage", ["rl", "eval"])
def test_tool_config_points_at_this_runs_sandbox(stage: str) -> None:
    run = run_of("qwen32b-h200")
    ctx = context_of(run, attempt=3)
    command = render_stage(run, stage, ctx)
    [(path, content)] = command.files.items()
    assert path == f"/data/retool/qwen32b-h200/stages/{stage}-3/tool_config.yaml"
    assert command.overrides[f"{ARR}.rollout.multi_turn.tool_config_path"] == path
    [tool] = yaml.safe_load(content)["tools"]
    assert tool["class_name"] == TOOL_CLASS
    assert tool["config"]["sandbox_url"] == "http://qwen32b-h200-sandbox.retool.svc:8080"
    assert tool["config"]["timeout_s"] == 30 and tool["config"]["memory_limit_mb"] == 1024 and tool["config"]["concurrency"] == 256 // 8


@pytest.mark.parametrize(
    ("variant", "head"),
    [
        pytest.param("qwen32b-h200", ("torchrun", "--standalone", "--nnodes=1", "--nproc_per_node=8", "-m", "verl.trainer.fsdp_sft_trainer"), id="one-node-torchrun"),
        pytest.param(
            "qwen7b-ascend-two-nodes",
            (*RAY_TORCHRUN, "--device-resource", "NPU", "--port", "29500", "--", "-m", "verl.trainer.fsdp_sft_trainer"),
            id="two-ascend-nodes-through-ray",
        ),
        pytest.param(
            "qwen32b-two-nodes",
            (*RAY_TORCHRUN, "--device-resource", "GPU", "--port", "29500", "--", "-m", "verl.trainer.fsdp_sft_trainer"),
            id="two-gpu-nodes-through-ray",
        ),
    ],
)
def test_sft_launcher(variant: str, head: tuple[str, ...]) -> None:
    run = run_of(variant)
    command = render_stage(run, "sft", context_of(run))
    assert command.argv[: len(head)] == head
    assert command.overrides["trainer.nnodes"] == run.spec.hardware.nodes


def test_merge_uses_the_latest_sft_checkpoint() -> None:
    run = run_of("qwen32b-h200")
    command = render_stage(run, "merge", context_of(run))
    assert command.argv == (
        "python3", "-m", "retool.runtime.cpu_only", "-m", "verl.model_merger", "merge", "--backend", "fsdp",
        "--local_dir", f"/data/retool/qwen32b-h200/checkpoints/sft/global_step_{LATEST}",
        "--target_dir", "/data/retool/qwen32b-h200/models/sft",
    )  # fmt: skip
    assert command.checkpoint_source == ("/data/retool/qwen32b-h200/checkpoints/sft", "")


def test_eval_merges_the_latest_rl_actor_before_evaluating() -> None:
    run = run_of("qwen32b-h200")
    command = render_stage(run, "eval", context_of(run))
    [merge] = command.pre
    assert merge[merge.index("--local_dir") + 1] == f"/data/retool/qwen32b-h200/checkpoints/rl/global_step_{LATEST}/actor"
    assert merge[merge.index("--target_dir") + 1] == command.overrides[f"{ARR}.model.path"] == run_paths(run).rl_merged
    assert command.checkpoint_source == ("/data/retool/qwen32b-h200/checkpoints/rl", "actor")


def test_eval_without_rl_merges_nothing() -> None:
    run = run_of("minimal-no-rl")
    command = render_stage(run, "eval", context_of(run))
    assert command.pre == () and not command.needs_latest_step


def test_prepare_runs_our_data_preparation_then_stages_the_model_on_the_mounted_spec() -> None:
    run = run_of("minimal")
    command = render_stage(run, "prepare", context_of(run), spec_file="/etc/retool/run.yaml")
    assert command.pre == (("python3", "-m", "retool.runtime.cpu_only", "-m", "retool.cli", "data", "prepare", "all", "--spec", "/etc/retool/run.yaml"),)
    assert command.argv == ("python3", "-m", "retool.runtime.cpu_only", "-m", "retool.staging", "--spec", "/etc/retool/run.yaml")


def test_without_an_mlflow_server_only_the_console_logs() -> None:
    run = run_of("minimal")
    command = render_stage(run, "rl", context_of(run, mlflow=None))
    assert command.overrides["trainer.logger"] == ["console"]
    assert "MLFLOW_TRACKING_URI" not in command.env


@pytest.mark.parametrize(
    ("variant", "stages"),
    [
        pytest.param("qwen32b-h200", ("prepare", "preflight", "sft", "merge", "rl", "eval"), id="all"),
        pytest.param("minimal-no-sft", ("prepare", "preflight", "rl", "eval"), id="no-sft-means-no-merge"),
        pytest.param("minimal-no-rl", ("prepare", "preflight", "sft", "merge", "eval"), id="no-rl"),
        pytest.param("minimal-no-preflight", ("prepare", "sft", "merge", "rl", "eval"), id="no-preflight"),
    ],
)
def test_enabled_stages(variant: str, stages: tuple[str, ...]) -> None:
    assert enabled_stages(run_of(variant)) == stages


@pytest.mark.parametrize(
    ("variant", "stage", "match"),
    [
        pytest.param("minimal-no-sft", "sft", "spec.sft.enabled is false", id="sft-disabled"),
        pytest.param("minimal-no-sft", "merge", "spec.sft.enabled is false", id="merge-disabled-with-sft"),
        pytest.param("minimal-no-rl", "rl", "spec.rl.enabled is false", id="rl-disabled"),
        pytest.param("minimal", "train", "unknown stage 'train'", id="unknown-stage"),
    ],
)
def test_render_errors_name_the_reason(variant: str, stage: str, match: str) -> None:
    run = run_of(variant)
    with pytest.raises(RenderError, match=match):
        render_stage(run, stage, context_of(run))


def test_context_of_another_run_is_refused() -> None:
    run = run_of("minimal")
    with pytest.raises(RenderError, match="stage context is for run 'other'"):
        render_stage(run, "rl", StageContext(run_name="other", namespace="default", sandbox_url="http://x:8080"))


def test_rendering_is_deterministic() -> None:
    run = run_of("qwen32b-h200")
    assert render_stage(run, "rl", context_of(run)) == render_stage(run, "rl", context_of(run))


@pytest.mark.parametrize(
    ("model", "stage", "fragment"),
    [
        pytest.param({"base": "s3://models/qwen-7b"}, "sft", "s3://models/qwen-7b is read from its copy at /data/default/minimal/models/base", id="s3-base"),
        pytest.param({"base": "Qwen/Qwen2.5-7B-Instruct", "revision": "v1"}, "sft", "Qwen/Qwen2.5-7B-Instruct at revision v1 is read from its copy", id="revision"),
        pytest.param({"base": "/data/models/mine"}, "prepare", "read in place from the PVC path /data/models/mine", id="pvc-path"),
    ],
)
def test_where_the_model_comes_from_is_said(model: dict[str, str], stage: str, fragment: str) -> None:
    from retool.spec.validate import parse_run
    from tests.render.cases import load_example

    doc = load_example("minimal")
    doc["spec"]["model"] = model
    run = parse_run(doc)
    assert any(fragment in note for note in render_stage(run, stage, context_of(run)).notes)


@pytest.mark.parametrize("variant", ["qwen32b-h200", "qwen7b-ascend"])
@pytest.mark.parametrize("stage", ["prepare", "merge"])
def test_stages_without_an_accelerator_never_autoload_a_device_backend(variant: str, stage: str) -> None:
    run = run_of(variant)
    assert render_stage(run, stage, context_of(run)).env["TORCH_DEVICE_BACKEND_AUTOLOAD"] == "0"


@pytest.mark.parametrize("stage", ["sft", "rl", "eval"])
def test_trainer_stages_keep_device_backends_and_put_caches_on_the_pvc(stage: str) -> None:
    run = run_of("qwen7b-ascend")
    command = render_stage(run, stage, context_of(run))
    assert "TORCH_DEVICE_BACKEND_AUTOLOAD" not in command.env
    root = run_paths(run).root
    expected = {"HF_HOME": "huggingface", "VLLM_CACHE_ROOT": "vllm", "TORCHINDUCTOR_CACHE_DIR": "torchinductor", "TRITON_CACHE_DIR": "triton"}
    assert {key: command.env[key] for key in expected} == {key: f"{root}/cache/{sub}" for key, sub in expected.items()}
    if stage != "sft":  # Ray workers of main_ppo get the same environment through the job's runtime_env
        assert command.overrides["+ray_kwargs.ray_init.runtime_env.env_vars.HF_HOME"] == f"{root}/cache/huggingface"
