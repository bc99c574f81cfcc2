"""Real local servers for the storage and tracking tests: moto's S3 server (and MLflow, in tests/tracking)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from tests.conftest import free_port, repo_env

DUMMY_AWS = {
    "AWS_ACCESS_KEY_ID": "retool-test",
    "AWS_SECRET_ACCESS_KEY": "retool-test-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def wait_http(url: str, process: subprocess.Popen, log: Path, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{url} exited with {process.returncode}:\n{log.read_text()[-4000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code < 500:
                return
        time.sleep(0.2)
    raise RuntimeError(f"{url} not ready after {timeout}s:\n{log.read_text()[-4000:]}")


@contextlib.contextmanager
def serve(args: list[str], ready_url: str, log: Path, env: dict[str, str]) -> Iterator[None]:
    with open(log, "wb") as out:
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        wait_http(ready_url, process, log)
        yield
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def moto_server(workdir: Path) -> Iterator[str]:
    """An S3-compatible endpoint on 127.0.0.1 (moto in server mode); yields its URL."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    env = repo_env(**DUMMY_AWS)
    with serve([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], f"{endpoint}/moto-api/", workdir / "moto.log", env):
        yield endpoint


def aws_env(endpoint: str) -> dict[str, str]:
    """Client-side environment: dummy credentials, the endpoint through boto3's standard variable, no host config."""
    return {**DUMMY_AWS, "AWS_ENDPOINT_URL_S3": endpoint, "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull}
