"""Register the final model in the MLflow Model Registry, with its eval scores.

Weights are never loaded, and never pushed through the tracking server when a copy already
sits in S3: with ``model_uri`` (the S3 mirror of the merged model) the version's source IS that
URI, and only the small files (config, tokenizer, generation config) are logged under the
run's ``model/`` artifacts so the UI shows what the model is. Without an S3 copy, the whole
Hugging Face directory is logged as artifacts and the version points at ``runs:/<run>/model``.
Registering twice from the same run returns the existing version (tags refreshed).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

from retool.recipe.metrics import mlflow_metric_key
from retool.tracking import naming
from retool.tracking._client import client, is_resource_exists, reported

log = logging.getLogger(__name__)

MODEL_ARTIFACT_DIR = "model"
METADATA_SUFFIXES = (".json", ".txt", ".model", ".jinja", ".md", ".py", ".tiktoken")
"""Small files that describe a Hugging Face model (config, tokenizer, chat template), never weights."""
METADATA_MAX_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class ModelVersionRef:
    name: str
    version: str
    source: str


def score_tags(results: Mapping[str, Mapping[str, float]]) -> dict[str, str]:
    """``{aime_2024: {mean@30: 0.41}}`` -> ``{"eval.aime_2024.mean_at_30": "0.41"}`` (registry tag keys refuse ``@``)."""
    return {mlflow_metric_key(f"eval.{source}.{metric}"): repr(float(value)) for source, metrics in results.items() for metric, value in metrics.items()}


def describe(results: Mapping[str, Mapping[str, float]], run_label: str) -> str:
    """A Markdown table of the eval scores for the version's description."""
    metrics = sorted({metric for values in results.values() for metric in values})
    lines = [f"ReTool model from {run_label}.", "", "| data source | " + " | ".join(metrics) + " |", "|---|" + "---|" * len(metrics)]
    for source in sorted(results):
        cells = [f"{results[source][m]:.4f}" if m in results[source] else "" for m in metrics]
        lines.append(f"| {source} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def metadata_files(model_dir: str) -> list[str]:
    """Relative paths of the model directory's descriptive files (no weights, nothing huge)."""
    chosen = []
    for directory, dirnames, filenames in os.walk(model_dir):
        dirnames.sort()
        for name in sorted(filenames):
            path = os.path.join(directory, name)
            if name.endswith(METADATA_SUFFIXES) and os.path.getsize(path) <= METADATA_MAX_BYTES:
                chosen.append(os.path.relpath(path, model_dir))
    return chosen


def register_final_model(
    tracking_uri: str,
    *,
    run_id: str,
    model_name: str,
    model_dir: str,
    results: Mapping[str, Mapping[str, float]],
    model_uri: str | None = None,
    tags: Mapping[str, str] | None = None,
) -> ModelVersionRef:
    """Register the model of ``run_id`` (the eval or RL stage run) under ``model_name`` with its scores."""
    if not os.path.isdir(model_dir):
        raise FileNotFoundError(f"model directory {model_dir} does not exist")
    if not os.path.isfile(os.path.join(model_dir, "config.json")):
        raise ValueError(f"{model_dir} is not a Hugging Face model directory (no config.json)")
    if model_uri is not None and "://" not in model_uri:
        raise ValueError(f"model_uri {model_uri!r} must be a URI such as s3://bucket/prefix")
    mlflow_client = client(tracking_uri)
    with reported(tracking_uri, f"registering {model_name!r} from run {run_id}"):
        run = mlflow_client.get_run(run_id)
        version_tags = {key: value for key, value in run.data.tags.items() if key in (naming.TAG_UID, naming.TAG_NAMESPACE, naming.TAG_NAME, naming.TAG_STAGE)}
        version_tags.update(score_tags(results))
        version_tags.update({key: str(value) for key, value in (tags or {}).items()})
        description = describe(results, f"{version_tags.get(naming.TAG_NAMESPACE, '?')}/{version_tags.get(naming.TAG_NAME, '?')} (run {run_id})")
        try:
            mlflow_client.create_registered_model(model_name, description="ReTool models (tool-integrated RL), one version per RetoolRun.")
        except Exception as exc:
            if not is_resource_exists(exc):
                raise
        existing = mlflow_client.search_model_versions(f"name = '{_safe(model_name)}' and run_id = '{_safe(run_id)}'")
        if existing:
            version = existing[0]
            for key, value in version_tags.items():
                mlflow_client.set_model_version_tag(model_name, version.version, key, value)
            mlflow_client.update_model_version(model_name, version.version, description=description)
            return ModelVersionRef(name=model_name, version=str(version.version), source=version.source)
        if model_uri is None:
            mlflow_client.log_artifacts(run_id, model_dir, MODEL_ARTIFACT_DIR)
            source = f"runs:/{run_id}/{MODEL_ARTIFACT_DIR}"
        else:
            for relative in metadata_files(model_dir):
                sub = os.path.dirname(relative)
                mlflow_client.log_artifact(run_id, os.path.join(model_dir, relative), f"{MODEL_ARTIFACT_DIR}/{sub}" if sub else MODEL_ARTIFACT_DIR)
            mlflow_client.log_text(run_id, model_uri + "\n", f"{MODEL_ARTIFACT_DIR}/WEIGHTS_LOCATION.txt")
            source = model_uri
        version = mlflow_client.create_model_version(model_name, source, run_id=run_id, tags=version_tags, description=description)
        log.info("registered %s version %s from %s", model_name, version.version, source)
        return ModelVersionRef(name=model_name, version=str(version.version), source=version.source)


def _safe(value: str) -> str:
    if "'" in value or "\\" in value:
        raise ValueError(f"{value!r} cannot be used in an MLflow search filter")
    return value
