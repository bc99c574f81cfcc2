from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from tests.storage.servers import DUMMY_AWS, aws_env, moto_server

_buckets = itertools.count()


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with moto_server(Path(tmp_path_factory.mktemp("moto"))) as endpoint:
        yield endpoint


@pytest.fixture
def s3_env(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Credentials and endpoint through the standard environment variables, as stage pods get them."""
    for key in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    for key, value in aws_env(s3_endpoint).items():
        monkeypatch.setenv(key, value)
    return s3_endpoint


@pytest.fixture
def s3(s3_endpoint: str):
    return boto3.client("s3", endpoint_url=s3_endpoint, **{k.lower(): v for k, v in DUMMY_AWS.items() if k != "AWS_DEFAULT_REGION"}, region_name="us-east-1")


@pytest.fixture
def bucket(s3, s3_env: str) -> str:
    name = f"retool-test-{next(_buckets)}"
    s3.create_bucket(Bucket=name)
    return name
