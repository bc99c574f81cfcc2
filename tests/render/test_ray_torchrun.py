"""The multi-node SFT launcher: per-node torchrun commands, and a real run on a local Ray node."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from retool.runtime.ray_torchrun import bundle_resources, first_failure, forwarded_env, launch, parse_args, torchrun_argv
from tests.conftest import free_port, repo_env


@pytest.mark.parametrize("rank", [0, 1, 3])
def test_each_node_gets_its_rank_and_the_masters_address(rank: int) -> None:
    argv = torchrun_argv(python="py", nodes=4, devices_per_node=8, node_rank=rank, master_addr="10.0.0.5", port=29500, program=["-m", "verl.trainer.fsdp_sft_trainer", "a=1"])
    assert argv == [
        "py", "-m", "torch.distributed.run", "--nnodes=4", "--nproc_per_node=8", f"--node_rank={rank}",
        "--master_addr=10.0.0.5", "--master_port=29500", "-m", "verl.trainer.fsdp_sft_trainer", "a=1",
    ]  # fmt: skip


def test_rank_outside_the_job_is_refused() -> None:
    with pytest.raises(ValueError, match=r"node_rank 2 is outside 0\.\.1"):
        torchrun_argv(python="py", nodes=2, devices_per_node=8, node_rank=2, master_addr="h", port=1, program=["x.py"])


@pytest.mark.parametrize(
    ("statuses", "expected"),
    [pytest.param([0, 0], 0, id="all-ok"), pytest.param([0, 3, 1], 3, id="first-failure"), pytest.param([-9, 0], -9, id="killed")],
)
def test_first_failure(statuses: list[int], expected: int) -> None:
    assert first_failure(statuses) == expected


def test_environment_forwarded_to_other_nodes() -> None:
    env = forwarded_env({"MLFLOW_TRACKING_URI": "u", "VLLM_USE_V1": "1", "HCCL_OP_EXPANSION_MODE": "AIV", "HOME": "/root", "PYTHONUNBUFFERED": "1", "RETOOL_RUN_NAME": "r"})
    assert env == {"MLFLOW_TRACKING_URI": "u", "VLLM_USE_V1": "1", "HCCL_OP_EXPANSION_MODE": "AIV", "PYTHONUNBUFFERED": "1", "RETOOL_RUN_NAME": "r"}


def test_every_variable_the_sft_command_sets_reaches_the_other_nodes() -> None:
    """The caches on the PVC and the accelerator switches: torchrun on node 2 must see what node 1 sees."""
    from retool.recipe.render.stages import render_stage
    from tests.render.cases import context_of, run_of

    run = run_of("qwen7b-ascend-two-nodes")
    env = dict(render_stage(run, "sft", context_of(run)).env)
    assert forwarded_env(env) == env


def test_bundle_holds_the_nodes_devices() -> None:
    assert bundle_resources("NPU", 8) == {"CPU": 1, "NPU": 8}


@pytest.mark.parametrize(
    ("argv", "program"),
    [
        pytest.param(["--nodes", "2", "--devices-per-node", "8", "--", "-m", "m", "k=v"], ["-m", "m", "k=v"], id="after-double-dash"),
        pytest.param(["--nodes", "2", "--devices-per-node", "8", "train.py"], ["train.py"], id="script"),
    ],
)
def test_arguments(argv: list[str], program: list[str]) -> None:
    assert parse_args(argv).program == program


def test_nothing_to_run_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args(["--nodes", "2", "--devices-per-node", "8", "--"])
    assert exited.value.code == 2
    assert "nothing to run: give the torchrun program after --" in capsys.readouterr().err


@pytest.mark.slow
def test_launch_runs_torchrun_in_a_ray_bundle(tmp_path: Path) -> None:
    """A real Ray node with a custom NPU resource and real torch.distributed.run workers."""
    import ray

    ray.init(num_cpus=2, resources={"NPU": 2}, include_dashboard=False, log_to_driver=False)
    try:
        env = repo_env(RETOOL_PROBE="forwarded")
        status = launch(
            nodes=1,
            devices_per_node=2,
            device_resource="NPU",
            port=free_port(),
            program=["-m", "tests.render.torchrun_probe", str(tmp_path)],
            environ={k: v for k, v in env.items() if k in ("PYTHONPATH", "RETOOL_PROBE")},
        )
        ray_node_ip = ray.util.get_node_ip_address()
    finally:
        ray.shutdown()
    assert status == 0
    seen = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [s["WORLD_SIZE"] for s in seen] == ["2", "2"]
    assert {s["LOCAL_RANK"] for s in seen} == {"0", "1"}
    assert all(s["RETOOL_PROBE"] == "forwarded" for s in seen)
    assert {s["MASTER_ADDR"] for s in seen} == {ray_node_ip}
