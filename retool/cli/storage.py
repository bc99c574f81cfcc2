"""``retool storage upload|download SRC DST``: verified, resumable directory copies for operators and stage scripts.

Exit status 0 on success, 1 on a failed copy (checksum mismatch, missing manifest, access
denied, ...) with the reason on stderr. A rerun after a failure resumes: files already in
place with the right checksum are skipped.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from retool.storage import ChecksumMismatchError, ManifestMissingError, TransferSettings, download_dir, upload_dir
from retool.storage.s3 import MiB

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "storage",
        help="copy checkpoint/model directories between the PVC and S3, verified and resumable: storage upload, storage download",
        description="Copy directories between local (PVC) paths and s3://bucket/prefix URIs with sha256 verification.",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, help_text in (
        ("upload", "copy local directory SRC to DST (s3://bucket/prefix or a local path); writes a sha256 manifest last"),
        ("download", "copy SRC (s3://bucket/prefix or a local path with a manifest) to local directory DST, verifying every file"),
    ):
        action = actions.add_parser(name, help=help_text, description=help_text)
        action.add_argument("src", metavar="SRC")
        action.add_argument("dst", metavar="DST")
        action.add_argument("--endpoint-url", help="S3-compatible endpoint (default: AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, else AWS)")
        action.add_argument("--region", help="bucket region (default: AWS_REGION / AWS_DEFAULT_REGION)")
        action.add_argument("--multipart-threshold-mib", type=int, default=64, help="files above this size use multipart transfers")
        action.add_argument("--chunk-mib", type=int, default=64, help="multipart part size (>= 5)")
        action.add_argument("--workers", type=int, default=4, help="files transferred at once")
        action.add_argument("--json", action="store_true", help="print a JSON report")
        action.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        settings = TransferSettings(
            multipart_threshold=args.multipart_threshold_mib * MiB, multipart_chunksize=args.chunk_mib * MiB, file_workers=args.workers
        )
        copy = upload_dir if args.action == "upload" else download_dir
        report = copy(args.src, args.dst, settings=settings, endpoint_url=args.endpoint_url, region=args.region)
    except (ValueError, FileNotFoundError, ManifestMissingError, ChecksumMismatchError) as exc:
        print(f"retool storage {args.action}: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # botocore errors: credentials, access, network after retries
        log.debug("storage failure", exc_info=True)
        print(f"retool storage {args.action}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    summary = {
        "source": report.source,
        "destination": report.destination,
        "transferred": len(report.transferred),
        "skipped": len(report.skipped),
        "bytes": report.bytes_transferred,
    }
    text = f"{report.source} -> {report.destination}: {summary['transferred']} transferred ({summary['bytes']} bytes), {summary['skipped']} already present"
    print(json.dumps(summary) if args.json else text)
    return 0
