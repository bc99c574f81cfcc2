"""What a stage pod knows beyond the spec: the contract between the operator and ``retool.stage``.

The operator sets these environment variables on every stage pod (Job or Ray head); the stage
entrypoint reads them back. Keeping both directions in one place keeps the names in step.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

ENV_RUN_NAME = "RETOOL_RUN_NAME"
ENV_NAMESPACE = "RETOOL_RUN_NAMESPACE"
ENV_RUN_UID = "RETOOL_RUN_UID"
ENV_SANDBOX_URL = "RETOOL_SANDBOX_URL"
ENV_ATTEMPT = "RETOOL_ATTEMPT"
ENV_IMAGE = "RETOOL_IMAGE"
ENV_MLFLOW_URI = "MLFLOW_TRACKING_URI"
ENV_MLFLOW_EXPERIMENT = "MLFLOW_EXPERIMENT_NAME"
ENV_MLFLOW_PARENT_RUN = "RETOOL_MLFLOW_PARENT_RUN_ID"
ENV_HF_TOKEN = "HF_TOKEN"
"""The prepare stage's Hugging Face token: the operator sets it from ``spec.model.tokenSecretRef``
(``valueFrom.secretKeyRef``); ``huggingface_hub`` and ``datasets`` read it from the environment."""

SPEC_MOUNT_PATH = "/etc/retool/run.yaml"
"""Where the operator mounts the run's spec (ConfigMap ``<run>-spec``) in stage pods."""


@dataclass(frozen=True)
class StageContext:
    run_name: str
    namespace: str
    sandbox_url: str
    attempt: int = 1
    run_uid: str | None = None
    image: str | None = None
    mlflow_tracking_uri: str | None = None
    mlflow_experiment: str | None = None
    mlflow_parent_run_id: str | None = None

    def to_env(self) -> dict[str, str]:
        values = {
            ENV_RUN_NAME: self.run_name,
            ENV_NAMESPACE: self.namespace,
            ENV_SANDBOX_URL: self.sandbox_url,
            ENV_ATTEMPT: str(self.attempt),
            ENV_RUN_UID: self.run_uid,
            ENV_IMAGE: self.image,
            ENV_MLFLOW_URI: self.mlflow_tracking_uri,
            ENV_MLFLOW_EXPERIMENT: self.mlflow_experiment,
            ENV_MLFLOW_PARENT_RUN: self.mlflow_parent_run_id,
        }
        return {key: value for key, value in values.items() if value}

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> StageContext:
        # RETOOL_SANDBOX_URL is absent in text-only runs (no sandbox); tool-integrated stages need it.
        missing = [key for key in (ENV_RUN_NAME, ENV_NAMESPACE) if not env.get(key)]
        if missing:
            raise ValueError(f"stage environment lacks {', '.join(missing)} (set by the retool operator)")
        return cls(
            run_name=env[ENV_RUN_NAME],
            namespace=env[ENV_NAMESPACE],
            sandbox_url=env.get(ENV_SANDBOX_URL, ""),
            attempt=int(env.get(ENV_ATTEMPT, "1")),
            run_uid=env.get(ENV_RUN_UID) or None,
            image=env.get(ENV_IMAGE) or None,
            mlflow_tracking_uri=env.get(ENV_MLFLOW_URI) or None,
            mlflow_experiment=env.get(ENV_MLFLOW_EXPERIMENT) or None,
            mlflow_parent_run_id=env.get(ENV_MLFLOW_PARENT_RUN) or None,
        )
