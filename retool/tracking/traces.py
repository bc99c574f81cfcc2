"""Rollout traces: verl 0.6.1's agent loop records each multi-turn trajectory as an MLflow trace.

With ``actor_rollout_ref.rollout.trace.backend=mlflow`` every agent-loop worker calls
``mlflow.set_experiment(trainer.project_name)`` and wraps each trajectory in a span
``agent_loop`` tagged ``step``, ``sample_index``, ``rollout_n``, ``validate`` and
``experiment_name``; the tool agent loop's generate and tool calls are child spans. With
``token2text=True`` the prompt and response token ids are also decoded, so the UI shows the
reasoning, the code, the interpreter output and the answer as text.

To open one: MLflow UI -> experiment ``<namespace>/<name>`` -> Traces, search
``tags.step = '40' AND tags.validate = 'True'`` (see :func:`trace_filter`), open a row.
Traces are large (a 16k-token trajectory per sample): enable them for debugging runs, not for
every 400-step run.
"""

from __future__ import annotations

TRACE_BACKEND_KEY = "actor_rollout_ref.rollout.trace.backend"
TRACE_TOKEN2TEXT_KEY = "actor_rollout_ref.rollout.trace.token2text"


def rollout_trace_overrides(enabled: bool) -> list[str]:
    """Hydra overrides for ``verl.trainer.main_ppo`` (spec.rl.rolloutTraces); none when disabled.

    The workers need ``MLFLOW_TRACKING_URI`` in their environment, and ``trainer.project_name``
    must be the run's experiment so traces land beside its metrics.
    """
    return [f"{TRACE_BACKEND_KEY}=mlflow", f"{TRACE_TOKEN2TEXT_KEY}=True"] if enabled else []


def trace_filter(step: int | None = None, *, validate: bool | None = None, sample_index: int | None = None, run_name: str | None = None) -> str:
    """An MLflow trace search filter selecting trajectories by the tags verl sets."""
    clauses = []
    if step is not None:
        clauses.append(f"tags.step = '{int(step)}'")
    if validate is not None:
        clauses.append(f"tags.validate = '{bool(validate)}'")
    if sample_index is not None:
        clauses.append(f"tags.sample_index = '{int(sample_index)}'")
    if run_name is not None:
        if "'" in run_name:
            raise ValueError(f"{run_name!r} cannot be used in an MLflow search filter")
        clauses.append(f"tags.experiment_name = '{run_name}'")
    return " AND ".join(clauses)
