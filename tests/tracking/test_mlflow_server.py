"""Tracking against a real MLflow server (sqlite) with artifacts in a real S3-compatible store (moto)."""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from mlflow import MlflowClient

from retool.recipe.metrics import samples_from_rows, to_mlflow_metrics, validation_metrics
from retool.runtime.context import StageContext
from retool.tracking import (
    TrackingError,
    end_run,
    ensure_parent_run,
    load_eval_results,
    log_eval_results,
    log_stage_commands,
    log_validation_samples,
    prepare_stage_run,
    register_final_model,
    stage_env,
    start_stage_run,
    sync_validation_dumps,
    trace_filter,
)
from tests.conftest import free_port, repo_env
from tests.tracking.conftest import MLflowServer

pytestmark = pytest.mark.slow

_runs = itertools.count()


def new_parent(server: MLflowServer, **overrides):
    index = next(_runs)
    kwargs = {
        "experiment": f"ns-{index}/run-{index}",
        "namespace": f"ns-{index}",
        "name": f"run-{index}",
        "uid": str(uuid.uuid4()),
        "spec_params": {"rl.batchSize": "512", "rl.algorithm": "grpo", "data.eval.0.name": "aime_2024"},
        "image": "retool/trainer:0.1",
    }
    kwargs.update(overrides)
    return kwargs, ensure_parent_run(server.uri, **kwargs)


def test_parent_run_is_created_once_with_params_and_tags(mlflow_server: MLflowServer) -> None:
    kwargs, parent = new_parent(mlflow_server)
    again = ensure_parent_run(mlflow_server.uri, **kwargs)
    assert again.run_id == parent.run_id, "a retry or operator restart finds the same parent run"

    client = MlflowClient(mlflow_server.uri)
    experiment = client.get_experiment(parent.experiment_id)
    assert experiment.name == kwargs["experiment"]
    runs = client.search_runs([parent.experiment_id])
    assert [r.info.run_id for r in runs] == [parent.run_id]
    run = runs[0]
    assert run.data.params == kwargs["spec_params"]
    assert {k: run.data.tags[k] for k in ("retool.uid", "retool.namespace", "retool.name", "retool.image", "retool.role")} == {
        "retool.uid": kwargs["uid"],
        "retool.namespace": kwargs["namespace"],
        "retool.name": kwargs["name"],
        "retool.image": "retool/trainer:0.1",
        "retool.role": "pipeline",
    }
    assert parent.url == f"{mlflow_server.uri}/#/experiments/{parent.experiment_id}/runs/{parent.run_id}?workflowType=machine_learning"


def test_an_edited_spec_keeps_the_logged_params_and_says_what_changed(mlflow_server: MLflowServer) -> None:
    kwargs, parent = new_parent(mlflow_server)
    edited = {**kwargs, "spec_params": {**kwargs["spec_params"], "rl.batchSize": "256", "sandbox.maxConcurrent": "512"}}
    again = ensure_parent_run(mlflow_server.uri, **edited)
    assert again.run_id == parent.run_id
    assert again.changed_params == ("rl.batchSize",)
    run = MlflowClient(mlflow_server.uri).get_run(parent.run_id)
    assert run.data.params["rl.batchSize"] == "512"
    assert run.data.params["sandbox.maxConcurrent"] == "512"
    assert run.data.tags["retool.paramsChanged"] == "rl.batchSize"


def test_many_parent_runs_can_be_ensured_from_threads(mlflow_server: MLflowServer) -> None:
    async def ensure_all() -> list:
        calls = []
        for _ in range(4):
            index = next(_runs)
            kwargs = {"experiment": f"threads/run-{index}", "namespace": "threads", "name": f"run-{index}", "uid": str(uuid.uuid4()), "spec_params": {"a": str(index)}}
            calls.append(asyncio.to_thread(ensure_parent_run, mlflow_server.uri, **kwargs))
        return await asyncio.gather(*calls)

    parents = asyncio.run(ensure_all())
    assert len({p.run_id for p in parents}) == 4
    assert len({p.experiment_id for p in parents}) == 4


def test_stage_runs_nest_under_the_parent_one_per_attempt(mlflow_server: MLflowServer) -> None:
    kwargs, parent = new_parent(mlflow_server)
    first = start_stage_run(mlflow_server.uri, parent.run_id, "rl", 1, {"retool.image": "retool/trainer:0.2"})
    assert start_stage_run(mlflow_server.uri, parent.run_id, "rl", 1) == first, "the same attempt is found again"
    second = start_stage_run(mlflow_server.uri, parent.run_id, "rl", 2)
    assert second != first

    run = MlflowClient(mlflow_server.uri).get_run(first)
    assert run.info.run_name == f"{kwargs['name']}-rl-1"
    assert run.info.experiment_id == parent.experiment_id
    tags = run.data.tags
    assert tags["mlflow.parentRunId"] == parent.run_id
    assert (tags["retool.stage"], tags["retool.attempt"], tags["retool.uid"], tags["retool.image"]) == ("rl", "1", kwargs["uid"], "retool/trainer:0.2")

    end_run(mlflow_server.uri, first, "FAILED")
    assert MlflowClient(mlflow_server.uri).get_run(first).info.status == "FAILED"
    with pytest.raises(TrackingError, match="not a RetoolRun parent run"):
        start_stage_run(mlflow_server.uri, first, "eval", 1)
    with pytest.raises(ValueError, match="status must be one of"):
        end_run(mlflow_server.uri, first, "DONE")


def test_rendered_commands_land_in_the_s3_artifact_store(mlflow_server: MLflowServer) -> None:
    _, parent = new_parent(mlflow_server)
    run_id = start_stage_run(mlflow_server.uri, parent.run_id, "sft", 1)
    script = "torchrun --nproc_per_node=8 -m verl.trainer.fsdp_sft_trainer data.train_files=/data/sft.parquet\n"
    assert log_stage_commands(mlflow_server.uri, run_id, {"sft.sh": script}) == ["commands/sft.sh"]
    keys = mlflow_server.bucket_keys(run_id)
    assert keys == [f"root/{parent.experiment_id}/{run_id}/artifacts/commands/sft.sh"]
    body = mlflow_server.s3().get_object(Bucket=mlflow_server.bucket, Key=keys[0])["Body"].read().decode()
    assert body == script
    with pytest.raises(ValueError, match="plain file name"):
        log_stage_commands(mlflow_server.uri, run_id, {"../x.sh": "echo"})


def load_table(server: MLflowServer, run_id: str, artifact: str) -> dict:
    """The table as the UI reads it: a logged-artifacts tag entry plus the JSON file (MlflowClient.load_table uses the global URI)."""
    client = MlflowClient(server.uri)
    logged = json.loads(client.get_run(run_id).data.tags["mlflow.loggedArtifacts"])
    assert {"path": artifact, "type": "table"} in logged
    with tempfile.TemporaryDirectory() as tmp:
        return json.loads(Path(client.download_artifacts(run_id, artifact, tmp)).read_text())


def eval_rows() -> list[dict]:
    rows = []
    for source, problems in (("aime_2024", 3), ("aime_2025", 2)):
        for p in range(problems):
            for i in range(4):
                correct = (p + i) % 3 == 0
                rows.append({"data_source": source, "uid": f"{source}-{p}", "prediction": str(7 if correct else i), "score": 1.0 if correct else -1.0, "acc": correct})
    return rows


def test_eval_results_metrics_table_and_summary(mlflow_server: MLflowServer) -> None:
    _, parent = new_parent(mlflow_server)
    run_id = start_stage_run(mlflow_server.uri, parent.run_id, "eval", 1)
    rows = eval_rows()
    results = log_eval_results(mlflow_server.uri, run_id, rows)

    expected = validation_metrics(*samples_from_rows(rows))
    assert results.metrics == expected
    logged = MlflowClient(mlflow_server.uri).get_run(run_id).data.metrics
    assert logged == pytest.approx(to_mlflow_metrics(expected))
    assert logged["val-core/aime_2024/acc/mean_at_4"] == pytest.approx(expected["val-core/aime_2024/acc/mean@4"])
    assert set(results.results) == {"aime_2024", "aime_2025"}
    assert set(results.results["aime_2024"]) == {"mean@4", "maj@4", "best@4", "pass@4"}

    prefix = f"root/{parent.experiment_id}/{run_id}/artifacts/eval/"
    assert mlflow_server.bucket_keys(run_id) == [prefix + name for name in ("metrics.json", "results.json", "samples.jsonl", "samples_table.json")]
    s3 = mlflow_server.s3()
    stored = json.loads(s3.get_object(Bucket=mlflow_server.bucket, Key=prefix + "results.json")["Body"].read())
    assert stored == results.results
    table = load_table(mlflow_server, run_id, "eval/samples_table.json")
    assert len(table["data"]) == len(rows)
    assert load_eval_results(mlflow_server.uri, run_id) == results.results, "what the operator reads back for status.results"
    with pytest.raises(ValueError, match="no per-sample results"):
        log_eval_results(mlflow_server.uri, run_id, [])


def test_a_stage_entrypoint_prepares_its_run_from_the_pod_environment(mlflow_server: MLflowServer) -> None:
    kwargs, parent = new_parent(mlflow_server)
    ctx = StageContext.from_env(
        {
            "RETOOL_RUN_NAME": kwargs["name"],
            "RETOOL_RUN_NAMESPACE": kwargs["namespace"],
            "RETOOL_SANDBOX_URL": "http://x-sandbox.ns.svc:8080",
            "RETOOL_ATTEMPT": "2",
            "RETOOL_IMAGE": "retool/trainer:0.3",
            "MLFLOW_TRACKING_URI": mlflow_server.uri,
            "RETOOL_MLFLOW_PARENT_RUN_ID": parent.run_id,
        }
    )
    stage = prepare_stage_run(ctx, "rl", commands={"rl.sh": "python -m verl.trainer.main_ppo ..."})
    assert stage is not None
    assert stage.experiment == kwargs["experiment"]
    assert stage.env == {"MLFLOW_TRACKING_URI": mlflow_server.uri, "MLFLOW_EXPERIMENT_NAME": kwargs["experiment"], "MLFLOW_RUN_ID": stage.run_id}
    assert prepare_stage_run(ctx, "rl").run_id == stage.run_id, "a restarted pod reuses its attempt's run"
    run = MlflowClient(mlflow_server.uri).get_run(stage.run_id)
    assert (run.data.tags["retool.attempt"], run.data.tags["retool.image"]) == ("2", "retool/trainer:0.3")
    assert [f.path for f in MlflowClient(mlflow_server.uri).list_artifacts(stage.run_id, "commands")] == ["commands/rl.sh"]
    untracked = StageContext(run_name="r", namespace="n", sandbox_url="http://s")
    assert prepare_stage_run(untracked, "rl") is None


def make_model_dir(root: Path) -> Path:
    (root / "config.json").parent.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text('{"architectures": ["Qwen2ForCausalLM"]}')
    (root / "tokenizer_config.json").write_text("{}")
    (root / "model.safetensors").write_bytes(b"\0" * 4096)
    return root


def test_register_the_s3_copy_without_pushing_weights(mlflow_server: MLflowServer, tmp_path: Path) -> None:
    kwargs, parent = new_parent(mlflow_server)
    run_id = start_stage_run(mlflow_server.uri, parent.run_id, "eval", 1)
    results = {"aime_2024": {"mean@30": 0.41, "maj@30": 0.5}}
    model_uri = "s3://retool-checkpoints/ns/run/models/rl"
    name = f"retool-{kwargs['name']}"

    version = register_final_model(mlflow_server.uri, run_id=run_id, model_name=name, model_dir=str(make_model_dir(tmp_path / "m")), results=results, model_uri=model_uri)
    assert version.source == model_uri
    again = register_final_model(mlflow_server.uri, run_id=run_id, model_name=name, model_dir=str(tmp_path / "m"), results={"aime_2024": {"mean@30": 0.42}}, model_uri=model_uri)
    assert again.version == version.version, "registering twice from one run keeps one version"

    stored = MlflowClient(mlflow_server.uri).get_model_version(name, version.version)
    assert stored.tags["eval.aime_2024.mean_at_30"] == "0.42"
    assert stored.tags["retool.uid"] == kwargs["uid"]
    assert "| aime_2024 |" in stored.description
    files = [key.rsplit("/artifacts/", 1)[1] for key in mlflow_server.bucket_keys(run_id)]
    assert files == ["model/WEIGHTS_LOCATION.txt", "model/config.json", "model/tokenizer_config.json"]


def test_register_by_uploading_the_model_directory(mlflow_server: MLflowServer, tmp_path: Path) -> None:
    kwargs, parent = new_parent(mlflow_server)
    run_id = start_stage_run(mlflow_server.uri, parent.run_id, "eval", 1)
    version = register_final_model(
        mlflow_server.uri, run_id=run_id, model_name=f"retool-{kwargs['name']}", model_dir=str(make_model_dir(tmp_path / "m")), results={"aime_2024": {"mean@30": 0.4}}
    )
    assert version.source == f"runs:/{run_id}/model"
    assert version.version == "1"
    files = [key.rsplit("/artifacts/", 1)[1] for key in mlflow_server.bucket_keys(run_id)]
    assert files == ["model/config.json", "model/model.safetensors", "model/tokenizer_config.json"]
    with pytest.raises(ValueError, match=r"no config\.json"):
        register_final_model(mlflow_server.uri, run_id=run_id, model_name="x", model_dir=str(tmp_path), results={})


def dump(directory: Path, step: int, count: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"input": f"problem {i}", "output": f"answer {i}", "gts": str(i), "score": 1.0, "step": step, "acc": True, "pred": str(i)}) for i in range(count)]
    (directory / f"{step}.jsonl").write_text("\n".join(lines) + "\n")


def test_validation_generations_every_round(mlflow_server: MLflowServer, tmp_path: Path) -> None:
    _, parent = new_parent(mlflow_server)
    run_id = start_stage_run(mlflow_server.uri, parent.run_id, "rl", 1)
    artifact = log_validation_samples(run_id, [("q1", "a1", 1.0), ("q2", "a2", -1.0)], 0, tracking_uri=mlflow_server.uri)
    assert artifact == "validation/step_000000.json"

    dump(tmp_path / "val", 5, 30)
    dump(tmp_path / "val", 10, 30)
    assert sync_validation_dumps(mlflow_server.uri, run_id, str(tmp_path / "val"), limit=8) == [5, 10]
    assert sync_validation_dumps(mlflow_server.uri, run_id, str(tmp_path / "val"), limit=8) == [], "a round is logged once"
    dump(tmp_path / "val", 15, 3)
    assert sync_validation_dumps(mlflow_server.uri, run_id, str(tmp_path / "val"), limit=8) == [15]

    client = MlflowClient(mlflow_server.uri)
    assert [f.path for f in client.list_artifacts(run_id, "validation")] == [f"validation/step_{s:06d}.json" for s in (0, 5, 10, 15)]
    table = load_table(mlflow_server, run_id, "validation/step_000005.json")
    assert len(table["data"]) == 8
    assert {row[table["columns"].index("step")] for row in table["data"]} == {5}
    assert {"input", "output", "gts", "score", "acc", "pred"} <= set(table["columns"])
    assert len(mlflow_server.bucket_keys(f"{run_id}/artifacts/validation/")) == 4


def run_python(code: str, env: dict[str, str]) -> None:
    import subprocess

    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def test_verl_logs_into_the_stage_run(mlflow_server: MLflowServer) -> None:
    kwargs, parent = new_parent(mlflow_server)
    run_id = start_stage_run(mlflow_server.uri, parent.run_id, "rl", 1)
    env = repo_env(**stage_env(mlflow_server.uri, kwargs["experiment"], run_id))
    run_python(
        f"""
        from verl.utils.tracking import Tracking
        config = {{"trainer": {{"total_training_steps": 400}}}}
        tracker = Tracking(project_name={kwargs["experiment"]!r}, experiment_name="{kwargs["name"]}-rl-1", default_backend=["mlflow"], config=config)
        tracker.log({{"val-core/aime_2024/acc/mean@30": 0.25, "actor/entropy": 0.5}}, step=5)
        import mlflow
        mlflow.end_run()
        """,
        env,
    )
    client = MlflowClient(mlflow_server.uri)
    assert len(client.search_runs([parent.experiment_id])) == 2, "verl resumed the stage run instead of creating one"
    run = client.get_run(run_id)
    assert run.data.metrics["val-core/aime_2024/acc/mean_at_30"] == 0.25
    assert run.data.params["trainer/total_training_steps"] == "400"
    assert run.data.tags["mlflow.parentRunId"] == parent.run_id


def test_verl_rollout_traces_are_found_by_step(mlflow_server: MLflowServer) -> None:
    kwargs, parent = new_parent(mlflow_server)
    env = repo_env(MLFLOW_TRACKING_URI=mlflow_server.uri)
    run_python(
        f"""
        import asyncio
        from types import SimpleNamespace
        import mlflow
        from verl.utils.rollout_trace import RolloutTraceConfig, rollout_trace_attr, rollout_trace_op

        class Tokenizer:
            def decode(self, ids):
                return " ".join(f"tok{{i}}" for i in ids)

        class Loop:
            tokenizer = Tokenizer()

            @rollout_trace_op
            async def generate(self, prompt_ids):
                return SimpleNamespace(prompt_ids=prompt_ids, response_ids=[7, 8, 9])

        async def main():
            for index in range(2):
                with rollout_trace_attr(step=5, sample_index=index, rollout_n=0, validate=True, name="agent_loop"):
                    await Loop().generate([1, 2, 3])

        RolloutTraceConfig.init({kwargs["experiment"]!r}, "{kwargs["name"]}-rl-1", "mlflow", token2text=True)
        asyncio.run(main())
        mlflow.flush_trace_async_logging(terminate=True)
        """,
        env,
    )
    client = MlflowClient(mlflow_server.uri)
    deadline = time.monotonic() + 30
    while True:
        traces = client.search_traces(locations=[parent.experiment_id], filter_string=trace_filter(step=5, validate=True))
        if len(traces) == 2 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert len(traces) == 2
    one = client.search_traces(locations=[parent.experiment_id], filter_string=trace_filter(step=5, sample_index=1))
    assert len(one) == 1
    spans = {span.name: span for span in one[0].data.spans}
    assert spans["Loop.generate"].outputs["response_text"] == "tok7 tok8 tok9"


def test_an_unreachable_tracker_fails_fast_and_names_itself() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(TrackingError, match=f"MLflow at {dead} is unreachable \\(connection refused\\): finding experiment"):
        ensure_parent_run(dead, experiment="x/y", namespace="x", name="y", uid="u", spec_params={})
    assert time.monotonic() - started < 60
