import pytest

from retool.runtime.context import StageContext
from retool.runtime.paths import run_paths
from retool.spec.validate import parse_run


def test_stage_context_round_trips_through_the_environment():
    ctx = StageContext(run_name="r", namespace="ns", sandbox_url="http://r-sandbox.ns.svc:8080", attempt=3, mlflow_tracking_uri="http://m:5000")
    assert StageContext.from_env(ctx.to_env()) == ctx


def test_stage_context_names_what_is_missing():
    with pytest.raises(ValueError, match="RETOOL_RUN_NAMESPACE"):
        StageContext.from_env({"RETOOL_RUN_NAME": "r", "RETOOL_SANDBOX_URL": "http://r-sandbox.ns.svc:8080"})


def test_a_text_only_stage_has_no_sandbox_url():
    """Text-only runs have no sandbox: the operator sets no RETOOL_SANDBOX_URL and the context reads it as empty."""
    ctx = StageContext(run_name="r", namespace="ns", sandbox_url="")
    assert "RETOOL_SANDBOX_URL" not in ctx.to_env()
    assert StageContext.from_env(ctx.to_env()) == ctx


def test_run_paths_are_namespaced_under_the_claim():
    run = parse_run(
        {
            "apiVersion": "retool.dev/v1alpha1",
            "kind": "RetoolRun",
            "metadata": {"name": "r", "namespace": "team"},
            "spec": {"storage": {"pvc": {"claimName": "d", "mountPath": "/mnt", "subPath": "runs"}}},
        }
    )
    paths = run_paths(run)
    assert paths.root == "/mnt/runs/team/r"
    assert paths.eval_set("aime_2024") == "/mnt/runs/team/r/data/eval/aime_2024.parquet"
    assert paths.sft_merged == "/mnt/runs/team/r/models/sft"
