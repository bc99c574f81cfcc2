"""The stage entrypoint's side effects against real servers: MLflow stage runs, eval results,
model registration and the S3 mirror."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from retool import stage_hooks
from retool.recipe.render.command import StageCommand
from retool.recipe.render.stages import render_stage
from retool.runtime.context import StageContext
from retool.runtime.paths import run_paths
from retool.spec.names import sandbox_url
from retool.spec.validate import parse_run
from retool.tracking import naming
from retool.tracking._client import client
from retool.tracking.params import spec_params
from retool.tracking.runs import ensure_parent_run
from tests.tracking.metric_sections import chart_section


def make_run(tmp_path: Path, *, s3_uri: str | None = None, endpoint: str | None = None, name: str = "hooks"):
    storage: dict = {"pvc": {"claimName": "d", "mountPath": str(tmp_path)}}
    if s3_uri:
        storage["s3"] = {"uri": s3_uri, "endpoint": endpoint}
    return parse_run({"apiVersion": "retool.dev/v1alpha1", "kind": "RetoolRun", "metadata": {"name": name, "namespace": "team"}, "spec": {"storage": storage}})


def context(run, uri: str | None = None, parent: str | None = None) -> StageContext:
    return StageContext(
        run_name=run.metadata.name,
        namespace="team",
        sandbox_url=sandbox_url(run.metadata.name, "team"),
        mlflow_tracking_uri=uri,
        mlflow_parent_run_id=parent,
        mlflow_experiment="team/hooks" if parent else None,
        image="trainer:1",
    )


def test_tracking_env_reaches_ray_workers_without_duplicating_rendered_keys(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    command = render_stage(run, "rl", context(run, "http://mlflow:5000"))
    tracked = stage_hooks.StageRun(run_id="abc", experiment="team/hooks", env={"MLFLOW_TRACKING_URI": "http://mlflow:5000", "MLFLOW_RUN_ID": "abc"})
    updated = stage_hooks.with_tracking_env(command, tracked)
    runtime_keys = [arg.split("=", 1)[0] for arg in updated.argv if arg.startswith(stage_hooks.RUNTIME_ENV_PREFIX)]
    assert len(runtime_keys) == len(set(runtime_keys))
    assert f"{stage_hooks.RUNTIME_ENV_PREFIX}MLFLOW_RUN_ID='abc'" in updated.argv
    assert updated.env["MLFLOW_RUN_ID"] == "abc"


def test_non_hydra_commands_get_the_environment_only(tmp_path: Path) -> None:
    command = StageCommand(stage="prepare", argv=("python3", "-m", "retool.cli", "data"))
    tracked = stage_hooks.StageRun(run_id="abc", experiment="e", env={"MLFLOW_RUN_ID": "abc"})
    updated = stage_hooks.with_tracking_env(command, tracked)
    assert updated.argv == command.argv and updated.env == {"MLFLOW_RUN_ID": "abc"}


@pytest.mark.parametrize(
    ("stage", "suffixes"),
    [("prepare", []), ("sft", ["checkpoints/sft"]), ("merge", ["models/sft"]), ("rl", ["checkpoints/rl"]), ("eval", ["models/rl", "eval"])],
)
def test_each_stage_mirrors_its_outputs_to_the_same_layout_under_s3(tmp_path: Path, stage: str, suffixes: list[str]) -> None:
    run = make_run(tmp_path, s3_uri="s3://bucket/runs/hooks/")
    root = run_paths(run).root
    assert stage_hooks.mirror_targets(run, stage) == [(f"{root}/{s}", f"s3://bucket/runs/hooks/{s}") for s in suffixes]
    assert stage_hooks.mirror_targets(make_run(tmp_path), stage) == []


def test_unreachable_mlflow_leaves_the_stage_untracked_not_failed(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    command = render_stage(run, "prepare", context(run))
    dead = context(run, "http://127.0.0.1:9", "0" * 32)
    assert stage_hooks.start(dead, "prepare", command) == (command, None)


def write_eval_outputs(run) -> None:
    paths = run_paths(run)
    Path(paths.eval_output).mkdir(parents=True)
    rows = []
    for p in range(4):
        for s in range(6):
            correct = (p + s) % 3 == 0
            score = 1.0 if correct else -1.0
            rows.append({"input": f"problem {p}", "output": "...", "score": score, "acc": float(correct), "pred": str(p if correct else s), "source": "aime_2024"})
    Path(paths.eval_output, "0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    model = Path(paths.rl_merged)
    model.mkdir(parents=True)
    (model / "config.json").write_text('{"model_type": "qwen2"}')
    (model / "model.safetensors").write_bytes(b"\0" * 4096)


def test_eval_stage_logs_results_mirrors_and_registers_the_model(tmp_path: Path, mlflow_server, s3_env) -> None:
    server = mlflow_server
    run = make_run(tmp_path, s3_uri=f"s3://{server.bucket}/mirror/hooks", endpoint=server.s3_endpoint)
    parent = ensure_parent_run(server.uri, experiment="team/hooks", namespace="team", name="hooks", uid="uid-hooks", spec_params=spec_params(run))
    ctx = context(run, server.uri, parent.run_id)
    command = render_stage(run, "eval", ctx)
    command, tracked = stage_hooks.start(ctx, "eval", command)
    assert tracked is not None and command.env["MLFLOW_RUN_ID"] == tracked.run_id
    write_eval_outputs(run)

    assert stage_hooks.finish(run, ctx, "eval", tracked, 0) == 0

    mlflow_client = client(server.uri)
    finished = mlflow_client.get_run(tracked.run_id)
    assert finished.info.status == "FINISHED"
    assert finished.data.tags["mlflow.parentRunId"] == parent.run_id
    # 4 problems x 6 samples, problem p correct on samples s with (p+s) % 3 == 0: 2 of 6 each
    assert finished.data.metrics["val-core/aime_2024/acc/mean_at_6"] == pytest.approx(2 / 6)
    headline = mlflow_client.get_run(parent.run_id).data.metrics
    assert headline["final/aime_2024_mean_at_6"] == pytest.approx(2 / 6), "the parent run carries the eval scores (MLflow's compare view)"
    assert {chart_section(k) for k in headline} <= {"final", "best_validation", "progress"}, sorted(headline)
    versions = mlflow_client.search_model_versions(f"name = '{naming.registered_model_name('hooks')}'")
    assert len(versions) == 1 and versions[0].source == f"s3://{server.bucket}/mirror/hooks/models/rl"
    assert server.bucket_keys("mirror/hooks/models/rl/model.safetensors")
    assert server.bucket_keys("mirror/hooks/eval/0.jsonl")


def test_failed_command_closes_the_run_as_failed_and_mirrors_nothing(tmp_path: Path, mlflow_server, s3_env) -> None:
    server = mlflow_server
    run = make_run(tmp_path, s3_uri=f"s3://{server.bucket}/mirror/failed", endpoint=server.s3_endpoint, name="failed")
    parent = ensure_parent_run(server.uri, experiment="team/failed", namespace="team", name="failed", uid="uid-failed", spec_params=spec_params(run))
    ctx = context(run, server.uri, parent.run_id)
    _, tracked = stage_hooks.start(ctx, "rl", render_stage(run, "rl", ctx))
    assert stage_hooks.finish(run, ctx, "rl", tracked, 3) == 3
    assert client(server.uri).get_run(tracked.run_id).info.status == "FAILED"
    assert server.bucket_keys("mirror/failed") == []


def test_eval_without_its_dump_fails_the_stage_with_the_reason(tmp_path: Path, mlflow_server, caplog) -> None:
    server = mlflow_server
    run = make_run(tmp_path, name="nodump")
    parent = ensure_parent_run(server.uri, experiment="team/nodump", namespace="team", name="nodump", uid="uid-nodump", spec_params=spec_params(run))
    ctx = context(run, server.uri, parent.run_id)
    _, tracked = stage_hooks.start(ctx, "eval", render_stage(run, "eval", ctx))
    assert stage_hooks.finish(run, ctx, "eval", tracked, 0) == 1
    assert "0.jsonl" in caplog.text
    assert client(server.uri).get_run(tracked.run_id).info.status == "FAILED"


STAND_IN_TRAINER = """
import os, pathlib, sys
root = pathlib.Path(sys.argv[1])
pathlib.Path(sys.argv[3]).write_text(os.environ.get("MLFLOW_RUN_ID", ""))
for step in map(int, sys.argv[2].split(",")):
    actor = root / f"global_step_{step}" / "actor"
    actor.mkdir(parents=True, exist_ok=True)
    (actor / "model_world_size_8_rank_0.pt").write_bytes(b"x")
    (root / "latest_checkpointed_iteration.txt").write_text(str(step))
"""


@pytest.mark.parametrize(
    ("saved", "status", "mlflow_status", "reason"),
    [
        pytest.param("30,60", 3, "FAILED", "final checkpoint is global_step_60, not global_step_400", id="exit-0-at-step-60-of-400-fails"),
        pytest.param("360,400", 0, "FINISHED", None, id="exit-0-at-the-planned-last-step-succeeds"),
    ],
)
def test_the_stage_entrypoint_fails_a_trainer_that_exits_0_early(
    tmp_path: Path, mlflow_server, monkeypatch: pytest.MonkeyPatch, saved: str, status: int, mlflow_status: str, reason: str | None
) -> None:
    """The real entrypoint (``retool.stage.main``) and MLflow server; only the trainer is a stand-in
    that saves the given steps and exits 0, as verl does when its loop ends early."""
    import yaml

    from retool import stage

    server = mlflow_server
    name = f"early-{saved.replace(',', '-')}"
    run = make_run(tmp_path, name=name)
    parent = ensure_parent_run(server.uri, experiment=f"team/{name}", namespace="team", name=name, uid=f"uid-{name}", spec_params=spec_params(run))
    ctx = context(run, server.uri, parent.run_id)
    run_id_file = tmp_path / "run_id"
    trainer = StageCommand(stage="rl", argv=("python3", "-c", STAND_IN_TRAINER, run_paths(run).rl_checkpoints, saved, str(run_id_file)))
    monkeypatch.setattr(stage, "render_stage", lambda *args, **kwargs: trainer)
    spec = tmp_path / "run.yaml"
    spec.write_text(yaml.safe_dump(run.model_dump(mode="json", exclude_none=True)))
    assert stage.main(["rl", "--spec", str(spec)], {**ctx.to_env(), "PATH": "/usr/bin:/bin"}) == status
    finished = client(server.uri).get_run(run_id_file.read_text())
    assert finished.info.status == mlflow_status
    assert finished.data.tags.get(stage_hooks.FAILURE_TAG, "").startswith("the rl trainer exited 0") is (reason is not None)
    if reason:
        assert reason in finished.data.tags[stage_hooks.FAILURE_TAG]
