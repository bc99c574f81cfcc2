"""Directory copy throughput through retool.storage against a local moto S3 server.

moto is not S3: the figures measure this code's overhead (sha256 of every file, manifest,
multipart bookkeeping) on loopback, not a real object store. Starts moto on 127.0.0.1, uploads
and downloads a checkpoint-like directory, then re-runs both (the resume path: hash and skip).

    .venv/bin/python bench/storage_bench.py [--mib 256] [--files 8]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import boto3
import httpx

from retool.storage import TransferSettings, download_dir, upload_dir
from retool.storage.s3 import MiB


def start_moto(port: int) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        try:
            httpx.get(f"http://127.0.0.1:{port}/moto-api/", timeout=1)
            return process
        except httpx.HTTPError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError("moto did not start")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=256, help="total size")
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--port", type=int, default=18765)
    args = parser.parse_args()
    os.environ.update({"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"})
    endpoint = f"http://127.0.0.1:{args.port}"
    moto = start_moto(args.port)
    try:
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="bench")
        settings = TransferSettings(multipart_threshold=16 * MiB, multipart_chunksize=16 * MiB)
        with tempfile.TemporaryDirectory() as tmp:
            src = Path(tmp) / "ckpt"
            src.mkdir()
            per_file = args.mib * MiB // args.files
            for i in range(args.files):
                (src / f"model_world_size_8_rank_{i}.pt").write_bytes(os.urandom(per_file))
            total = per_file * args.files / MiB
            for label, call, a, b in (
                ("upload", upload_dir, str(src), "s3://bench/ckpt"),
                ("download", download_dir, "s3://bench/ckpt", str(Path(tmp) / "back")),
                ("upload again (all skipped)", upload_dir, str(src), "s3://bench/ckpt"),
                ("download again (all skipped)", download_dir, "s3://bench/ckpt", str(Path(tmp) / "back")),
            ):
                start = time.perf_counter()
                report = call(a, b, settings=settings, endpoint_url=endpoint)
                seconds = time.perf_counter() - start
                counts = f"transferred={len(report.transferred)} skipped={len(report.skipped)}"
                print(f"{label}: {total:.0f} MiB in {args.files} files, {seconds:.2f} s ({total / seconds:.0f} MiB/s), {counts}")
    finally:
        moto.terminate()
        moto.wait()


if __name__ == "__main__":
    main()
