"""Pure helpers: names, tags, the spec as params, trace overrides, registry tags."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from mlflow.utils.validation import _validate_param_name, _validate_tag_name

from retool.spec.validate import parse_run
from retool.tracking import naming
from retool.tracking.params import MAX_PARAM_VALUE, batches, fit_value, flatten, mlflow_params, param_changes, spec_params
from retool.tracking.registry import describe, metadata_files, score_tags
from retool.tracking.runs import ray_env_overrides, stage_env
from retool.tracking.traces import rollout_trace_overrides, trace_filter
from tests.conftest import EXAMPLES


@pytest.mark.parametrize(
    ("namespace", "name", "override", "expected"),
    [
        pytest.param("retool", "qwen32b-h200", None, "retool/qwen32b-h200", id="namespace slash name"),
        pytest.param(None, "minimal", None, "default/minimal", id="no namespace means default"),
        pytest.param("retool", "a", "shared-experiment", "shared-experiment", id="spec override wins"),
    ],
)
def test_experiment_name(namespace, name, override, expected) -> None:
    assert naming.experiment_name(namespace, name, override) == expected


def test_stage_tags_carry_identity_stage_and_attempt() -> None:
    parent = naming.parent_tags(namespace="ns", name="run", uid="u-1", image="trainer:1")
    tags = naming.stage_tags(parent, "p123", "rl", 2, {"retool.image": "trainer:2", "retool.job": "run-rl-2"})
    assert tags == {
        "retool.uid": "u-1",
        "retool.namespace": "ns",
        "retool.name": "run",
        "retool.image": "trainer:2",
        "retool.role": "stage",
        "mlflow.parentRunId": "p123",
        "retool.stage": "rl",
        "retool.attempt": "2",
        "retool.job": "run-rl-2",
    }
    assert naming.stage_run_name("run", "rl", 2) == "run-rl-2"


def test_filters_refuse_quotes() -> None:
    assert naming.parent_run_filter("abc-1") == "tags.`retool.uid` = 'abc-1' and tags.`retool.role` = 'pipeline'"
    with pytest.raises(ValueError, match="search filter"):
        naming.parent_run_filter("x' or '1'='1")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param({"rl": {"batchSize": 512, "offload": True}}, {"rl.batchSize": "512", "rl.offload": "true"}, id="nested mapping, bool lower-case"),
        pytest.param({"eval": [{"name": "a"}, {"name": "b"}]}, {"eval.0.name": "a", "eval.1.name": "b"}, id="list items by index"),
        pytest.param({"tolerations": [], "nodeSelector": {}}, {"tolerations": "[]", "nodeSelector": "{}"}, id="explicitly empty stays visible"),
        pytest.param({"revision": None, "lr": 1e-6}, {"lr": "1e-06"}, id="unset optional left out, float as JSON"),
    ],
)
def test_flatten(value, expected) -> None:
    assert flatten(value) == expected


def test_long_values_are_cut_to_mlflows_limit() -> None:
    cut = fit_value("x" * 10000)
    assert len(cut) == MAX_PARAM_VALUE
    assert cut.endswith("...[10000 chars, truncated]")
    assert fit_value("short") == "short"


@pytest.mark.parametrize(
    ("flat", "message"),
    [
        pytest.param({"a@b": "1", "a_b": "2"}, "collide", id="keys collide after sanitising"),
        pytest.param({"k" * 251: "1"}, "longer than", id="key too long"),
    ],
)
def test_mlflow_params_refuse(flat, message) -> None:
    with pytest.raises(ValueError, match=message):
        mlflow_params(flat)


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_example_spec_becomes_valid_params(example: Path) -> None:
    run = parse_run(next(d for d in yaml.safe_load_all(example.read_text()) if d))
    params = spec_params(run)
    assert params["rl.batchSize"] == str(run.spec.rl.batch_size)
    assert params["data.eval.0.name"] == run.spec.data.eval[0].name
    assert params["sandbox.memoryLimitMB"] == str(run.spec.sandbox.memory_limit_mb)
    for key, value in params.items():
        _validate_param_name(key)
        assert len(value) <= MAX_PARAM_VALUE


def test_param_changes_and_batches() -> None:
    new, changed = param_changes({"a": "1", "b": "2"}, {"a": "1", "b": "3", "c": "4"})
    assert new == {"c": "4"}
    assert changed == ["b"]
    assert [len(b) for b in batches({f"k{i:03d}": "v" for i in range(250)})] == [100, 100, 50]


def test_rollout_trace_overrides() -> None:
    assert rollout_trace_overrides(False) == []
    assert rollout_trace_overrides(True) == ["actor_rollout_ref.rollout.trace.backend=mlflow", "actor_rollout_ref.rollout.trace.token2text=True"]


def compose_ppo_trainer(overrides: list[str]):
    import os

    import verl
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=os.path.join(os.path.dirname(verl.__file__), "trainer", "config"), version_base=None):
            return compose(config_name="ppo_trainer", overrides=overrides)
    finally:
        GlobalHydra.instance().clear()


def test_verl_config_accepts_trace_and_ray_env_overrides() -> None:
    env = stage_env("http://mlflow.retool.svc:5000", "ns/run", "0123abcd")
    config = compose_ppo_trainer(rollout_trace_overrides(True) + ray_env_overrides(env))
    assert config.actor_rollout_ref.rollout.trace.backend == "mlflow"
    assert config.actor_rollout_ref.rollout.trace.token2text is True
    assert dict(config.ray_kwargs.ray_init.runtime_env.env_vars) == env


def test_ray_env_overrides_refuse_unquotable_values() -> None:
    with pytest.raises(ValueError, match="cannot be passed"):
        ray_env_overrides({"MLFLOW_RUN_ID": "a'b"})
    with pytest.raises(ValueError, match="not an environment variable"):
        ray_env_overrides({"A-B": "x"})


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        pytest.param({"step": 40, "validate": True}, "tags.step = '40' AND tags.validate = 'True'", id="one validation round"),
        pytest.param({"step": 3, "sample_index": 7}, "tags.step = '3' AND tags.sample_index = '7'", id="one prompt of a training step"),
        pytest.param({"run_name": "r-rl-1"}, "tags.experiment_name = 'r-rl-1'", id="one stage attempt"),
    ],
)
def test_trace_filter(kwargs, expected) -> None:
    assert trace_filter(**kwargs) == expected


def test_score_tags_are_valid_registry_tags_and_description_tabulates() -> None:
    results = {"aime_2024": {"mean@30": 0.41, "maj@30": 0.5}, "aime_2025": {"mean@30": 0.3}}
    tags = score_tags(results)
    assert tags == {"eval.aime_2024.mean_at_30": "0.41", "eval.aime_2024.maj_at_30": "0.5", "eval.aime_2025.mean_at_30": "0.3"}
    for key in tags:
        _validate_tag_name(key)
    text = describe(results, "ns/run")
    assert "| aime_2024 | 0.5000 | 0.4100 |" in text
    assert "| aime_2025 |  | 0.3000 |" in text


def test_metadata_files_leave_weights_out(tmp_path: Path) -> None:
    for name in ("config.json", "tokenizer.json", "merges.txt", "model-00001-of-00002.safetensors", "sub/chat_template.jinja", "pytorch_model.bin"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    assert metadata_files(str(tmp_path)) == ["config.json", "merges.txt", "tokenizer.json", "sub/chat_template.jinja"]
