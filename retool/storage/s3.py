"""The boto3 client and transfer settings every storage helper shares.

Credentials come from boto3's standard chain (env, web identity/IRSA, instance profile, shared
files); an S3-compatible endpoint (MinIO, OBS, Ceph) from the ``endpoint_url`` argument, else
boto3's own ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` variables. API calls retry with
botocore's standard mode; transfers are multipart above a threshold.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MiB = 1024 * 1024


@dataclass(frozen=True)
class TransferSettings:
    """Multipart and concurrency knobs (defaults suit multi-GiB checkpoint shards)."""

    multipart_threshold: int = 64 * MiB
    multipart_chunksize: int = 64 * MiB
    max_concurrency: int = 8
    """Parts of one file in flight."""
    file_workers: int = 4
    """Files copied at once."""
    max_attempts: int = 5
    """Attempts per API call (botocore) and per file (ours, for failures botocore gives up on)."""
    retry_backoff_seconds: float = 1.0
    """First wait before a file is retried; doubled each time (capped at 30 s)."""

    def __post_init__(self) -> None:
        if self.multipart_chunksize < 5 * MiB:
            raise ValueError("multipart_chunksize must be at least 5 MiB (the S3 minimum part size)")
        if self.multipart_threshold < 1 or self.max_concurrency < 1 or self.file_workers < 1 or self.max_attempts < 1:
            raise ValueError("transfer settings must be positive")

    def boto3_config(self) -> Any:
        from boto3.s3.transfer import TransferConfig

        return TransferConfig(
            multipart_threshold=self.multipart_threshold,
            multipart_chunksize=self.multipart_chunksize,
            max_concurrency=self.max_concurrency,
            use_threads=True,
        )


def make_client(endpoint_url: str | None = None, region: str | None = None, settings: TransferSettings | None = None) -> Any:
    """An S3 client; thread-safe, so one is shared by all transfer threads."""
    import boto3
    from botocore.config import Config

    settings = settings or TransferSettings()
    config = Config(
        retries={"max_attempts": settings.max_attempts, "mode": "standard"},
        max_pool_connections=max(10, settings.max_concurrency * settings.file_workers),
    )
    return boto3.session.Session().client("s3", endpoint_url=endpoint_url, region_name=region, config=config)


PERMANENT_ERROR_CODES = frozenset(
    {"AccessDenied", "NoSuchBucket", "NoSuchKey", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AllAccessDisabled", "InvalidBucketName", "404", "403"}
)


def is_retryable(exc: BaseException) -> bool:
    """Whether a failed file transfer is worth another attempt (network trouble yes, access denied no)."""
    from botocore.exceptions import BotoCoreError, ClientError

    if isinstance(exc, ClientError):
        return exc.response.get("Error", {}).get("Code") not in PERMANENT_ERROR_CODES
    return isinstance(exc, BotoCoreError | ConnectionError | TimeoutError)
