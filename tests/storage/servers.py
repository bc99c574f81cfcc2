"""Real local servers for the storage and tracking tests: moto's S3 server (and MLflow, in tests/tracking)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from retool.embedded.process import ManagedServer
from tests.conftest import free_port, repo_env

DUMMY_AWS = {
    "AWS_ACCESS_KEY_ID": "retool-test",
    "AWS_SECRET_ACCESS_KEY": "retool-test-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@contextlib.contextmanager
def moto_server(workdir: Path) -> Iterator[str]:
    """An S3-compatible endpoint on 127.0.0.1 (moto in server mode); yields its URL."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    with ManagedServer(name="moto", argv=argv, base_url=endpoint, ready_path="/moto-api/", log_path=workdir / "moto.log", env=repo_env(**DUMMY_AWS), start_timeout_s=90):
        yield endpoint


def aws_env(endpoint: str) -> dict[str, str]:
    """Client-side environment: dummy credentials, the endpoint through boto3's standard variable, no host config."""
    return {**DUMMY_AWS, "AWS_ENDPOINT_URL_S3": endpoint, "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull}
