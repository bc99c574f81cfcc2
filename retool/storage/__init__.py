"""Checkpoint and model storage: verified, resumable directory copies between the PVC and S3."""

from retool.storage.checkpoints import latest_checkpoint
from retool.storage.location import LocalLocation, S3Location, parse_location
from retool.storage.manifest import COPY_MARKER, MANIFEST_NAME, ChecksumMismatchError, ManifestMissingError
from retool.storage.s3 import TransferSettings, make_client
from retool.storage.transfer import TransferInterruptedError, TransferReport, abort_multipart_uploads, copy_dir, download_dir, upload_dir

__all__ = [
    "COPY_MARKER",
    "MANIFEST_NAME",
    "ChecksumMismatchError",
    "LocalLocation",
    "ManifestMissingError",
    "S3Location",
    "TransferInterruptedError",
    "TransferReport",
    "TransferSettings",
    "abort_multipart_uploads",
    "copy_dir",
    "download_dir",
    "latest_checkpoint",
    "make_client",
    "parse_location",
    "upload_dir",
]
