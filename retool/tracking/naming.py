"""Names and tags of everything a RetoolRun owns in MLflow (pure; no MLflow import).

The operator is level-triggered and may run the same step twice (a retry, a restart), so
MLflow objects are found again by tag, never remembered: the parent run by ``retool.uid``, a
stage run by its parent, stage and attempt, a model version by its source run.
"""

from __future__ import annotations

import re

from retool.spec.names import stage_child_name

TAG_PREFIX = "retool."
TAG_ROLE = "retool.role"
TAG_UID = "retool.uid"
TAG_NAMESPACE = "retool.namespace"
TAG_NAME = "retool.name"
TAG_STAGE = "retool.stage"
TAG_ATTEMPT = "retool.attempt"

SAVE_REQUEST_TAG = "retool.saveRequest"
"""Set by the operator on a running rl attempt's run when a node under it is going (``retool_operator.notice``):
the trainer saves a checkpoint at its next step boundary (``retool.recipe.verl_plugins.save_notice``)."""
SAVED_ON_NOTICE_TAG = "retool.savedOnNotice"
"""Set by the trainer once it saved on a request: ``<step>`` (the checkpoint's global step)."""
RESUMED_FROM_TAG = "retool.resumedFromStep"
"""Set by the trainer when it starts: the global step of the checkpoint it resumed from (0: none)."""

TAG_IMAGE = "retool.image"
TAG_PARAMS_CHANGED = "retool.paramsChanged"
ROLE_PARENT = "pipeline"
ROLE_STAGE = "stage"
PARENT_RUN_ID_TAG = "mlflow.parentRunId"
"""MLflow's own tag that nests a run under another in the UI."""
NOTE_TAG = "mlflow.note.content"
"""MLflow's own tag holding a run's (or an experiment's) description, shown and edited in the UI."""
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "finetuning"
"""What our experiments are: MLflow 3.17's UI opens an experiment without this tag in its GenAI view
(traces, evaluation runs); ``finetuning`` (one of the kinds its UI knows, with ``genai_development`` and
``custom_model_development``) opens the runs table and the metric charts."""

METRIC_GROUPS = (
    ("val-core/", "AIME mean@k / maj@k / best@k / pass@k of each validation round and of the eval stage (verl's names)"),
    ("tool/", "tool-use dynamics of each training step: code ratio, calls, outcomes, code pass rate, first-call position, lengths"),
    ("val-tool/", "the same dynamics on the validation rounds and the eval stage"),
    ("reward-watch/", "the second verifier's disagreement with the reward, and reward-hacking signals"),
    ("actor/, critic/, response_length/, timing_s/", "verl's own training metrics"),
)


def parent_description(namespace: str | None, name: str) -> str:
    """The parent run's description (Markdown): what the run is and where each plot lives."""
    groups = "\n".join(f"- `{prefix}` {meaning}" for prefix, meaning in METRIC_GROUPS)
    return (
        f"ReTool pipeline `{namespace or 'default'}/{name}`: one nested run per stage attempt (prepare, preflight, sft, rl, eval).\n\n"
        "This run's own metrics are the headline, for MLflow's Compare view of parent runs: `final/` the eval stage's scores, "
        "`best_validation/` the best RL validation score and its step, `progress/` the rl steps done.\n\n"
        f"Metric groups (open the rl and eval runs, Model metrics):\n{groups}\n\n"
        "Compare runs (e.g. tool vs text-only): `retool compare RUN [RUN ...]` logs a report under `compare/` of each parent run."
    )

MAX_TAG_VALUE = 8000
"""MLflow's run tag value limit (MAX_TAG_VAL_LENGTH in mlflow.utils.validation)."""

_FILTER_UNSAFE = re.compile(r"['\\]")


def experiment_name(namespace: str | None, name: str, override: str | None = None) -> str:
    """``spec.tracking.mlflow.experiment`` if set, else ``<namespace>/<name>``."""
    if override:
        return override
    return f"{namespace or 'default'}/{name}"


def stage_run_name(run: str, stage: str, attempt: int) -> str:
    """Same as the stage's Job/RayJob (``<run>-<stage>-<attempt>``): one name across kubectl and the MLflow UI.

    Render verl's ``trainer.experiment_name`` to this: verl renames the MLflow run it resumes.
    """
    return stage_child_name(run, stage, attempt)


def registered_model_name(name: str, override: str | None = None) -> str:
    """``spec.tracking.mlflow.registeredModelName`` if set, else the run name."""
    return override or name


def parent_tags(*, namespace: str | None, name: str, uid: str, image: str | None = None) -> dict[str, str]:
    tags = {TAG_ROLE: ROLE_PARENT, TAG_UID: uid, TAG_NAMESPACE: namespace or "default", TAG_NAME: name}
    if image:
        tags[TAG_IMAGE] = image
    return tags


def stage_tags(parent: dict[str, str], parent_run_id: str, stage: str, attempt: int, extra: dict[str, str] | None = None) -> dict[str, str]:
    """Tags of a stage run: the parent's identity tags, the stage and attempt, and the caller's extras (image, ...)."""
    if attempt < 1:
        raise ValueError("attempts are numbered from 1")
    tags = {key: value for key, value in parent.items() if key in (TAG_UID, TAG_NAMESPACE, TAG_NAME, TAG_IMAGE)}
    tags.update({TAG_ROLE: ROLE_STAGE, PARENT_RUN_ID_TAG: parent_run_id, TAG_STAGE: stage, TAG_ATTEMPT: str(attempt)})
    for key, value in (extra or {}).items():
        tags[key] = str(value)[:MAX_TAG_VALUE]
    return tags


def quote(value: str) -> str:
    """A value for an MLflow search filter; quotes and backslashes are refused rather than escaped."""
    if _FILTER_UNSAFE.search(value):
        raise ValueError(f"{value!r} cannot be used in an MLflow search filter")
    return f"'{value}'"


def parent_run_filter(uid: str) -> str:
    return f"tags.`{TAG_UID}` = {quote(uid)} and tags.`{TAG_ROLE}` = {quote(ROLE_PARENT)}"


def stage_run_filter(parent_run_id: str, stage: str, attempt: int) -> str:
    return f"tags.`{PARENT_RUN_ID_TAG}` = {quote(parent_run_id)} and tags.`{TAG_STAGE}` = {quote(stage)} and tags.`{TAG_ATTEMPT}` = {quote(str(attempt))}"


UI_WORKFLOW = "?workflowType=machine_learning"
"""MLflow 3.17's UI chooses between its GenAI and "Model training" views with a global switch (kept in the
browser, GenAI by default) that overrides the experiment's kind tag; this query parameter selects the
model-training view for the page it opens."""


def run_url(tracking_uri: str, experiment_id: str, run_id: str) -> str:
    """Where a user opens the run in the MLflow UI (its model-training view)."""
    return f"{tracking_uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}{UI_WORKFLOW}"
