"""MLflow tracking of RetoolRuns: an experiment per run, a parent run, a run per stage attempt,
eval metrics and tables, rendered commands, validation generations, and the registered model.

Every function takes the tracking URI explicitly, is synchronous and thread-safe (no fluent
MLflow state), and is idempotent, so the async operator runs them in ``asyncio.to_thread``.
"""

from retool.tracking._client import TrackingError
from retool.tracking.evaluation import EvalResults, load_eval_results, log_eval_results, log_validation_samples, read_sample_rows, sync_validation_dumps
from retool.tracking.naming import experiment_name, registered_model_name, stage_run_name
from retool.tracking.params import spec_params
from retool.tracking.registry import ModelVersionRef, register_final_model
from retool.tracking.runs import (
    ParentRun,
    StageRun,
    end_run,
    ensure_experiment,
    ensure_parent_run,
    log_run_cost,
    log_stage_commands,
    prepare_stage_run,
    ray_env_overrides,
    request_save,
    reward_suspect,
    stage_attempt_tags,
    stage_env,
    start_stage_run,
)
from retool.tracking.traces import rollout_trace_overrides, trace_filter

__all__ = [
    "EvalResults",
    "ModelVersionRef",
    "ParentRun",
    "StageRun",
    "TrackingError",
    "end_run",
    "ensure_experiment",
    "ensure_parent_run",
    "experiment_name",
    "load_eval_results",
    "log_eval_results",
    "log_run_cost",
    "log_stage_commands",
    "log_validation_samples",
    "prepare_stage_run",
    "ray_env_overrides",
    "read_sample_rows",
    "register_final_model",
    "registered_model_name",
    "request_save",
    "reward_suspect",
    "rollout_trace_overrides",
    "spec_params",
    "stage_attempt_tags",
    "stage_env",
    "stage_run_name",
    "start_stage_run",
    "sync_validation_dumps",
    "trace_filter",
]
