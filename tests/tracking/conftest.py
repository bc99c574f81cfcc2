"""A real MLflow server (sqlite backend) whose artifacts land in a real S3-compatible server (moto)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import boto3
import pytest

from retool.embedded.process import ManagedServer
from tests.conftest import free_port, repo_env
from tests.storage.conftest import s3_endpoint, s3_env  # noqa: F401  (fixtures shared with the storage tests)
from tests.storage.servers import DUMMY_AWS

ARTIFACT_BUCKET = "mlflow-artifacts"


@dataclass(frozen=True)
class MLflowServer:
    uri: str
    s3_endpoint: str
    bucket: str

    def s3(self):
        return boto3.client(
            "s3", endpoint_url=self.s3_endpoint, aws_access_key_id=DUMMY_AWS["AWS_ACCESS_KEY_ID"], aws_secret_access_key=DUMMY_AWS["AWS_SECRET_ACCESS_KEY"], region_name="us-east-1"
        )

    def bucket_keys(self, contains: str = "") -> list[str]:
        pages = self.s3().get_paginator("list_objects_v2").paginate(Bucket=self.bucket)
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []) if contains in o["Key"])


@pytest.fixture(scope="session")
def mlflow_server(s3_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MLflowServer]:  # noqa: F811
    workdir = Path(tmp_path_factory.mktemp("mlflow"))
    server = MLflowServer(uri=f"http://127.0.0.1:{free_port()}", s3_endpoint=s3_endpoint, bucket=ARTIFACT_BUCKET)
    server.s3().create_bucket(Bucket=ARTIFACT_BUCKET)
    port = server.uri.rsplit(":", 1)[1]
    args = [
        sys.executable, "-m", "mlflow", "server",
        "--host", "127.0.0.1", "--port", port, "--workers", "1",
        "--backend-store-uri", f"sqlite:///{workdir / 'mlflow.db'}",
        "--artifacts-destination", f"s3://{ARTIFACT_BUCKET}/root",
    ]  # fmt: skip
    # off, as the chart and the operator deploy it: MLflow's GenAI job runner is 8 more processes (~1.3 GB)
    env = repo_env(**DUMMY_AWS, MLFLOW_S3_ENDPOINT_URL=s3_endpoint, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    with ManagedServer(name="mlflow", argv=args, base_url=server.uri, ready_path="/health", log_path=workdir / "mlflow.log", env=env, start_timeout_s=90):
        yield server


@pytest.fixture(autouse=True)
def fail_fast_http(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the operator sets: a dead tracker costs seconds, not MLflow's default minutes of retries."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
