"""The process the fault-injection test kills: one retool.storage copy that stalls at its N-th request.

Run through multiprocessing's forkserver (boto3 and retool.storage preloaded, so a child starts in
milliseconds). The child counts every HTTP request its S3 client is about to send; at request
``stall_at`` it tells the test where it is and waits there, as a transfer does on a slow network,
until the test kills it. Requests run one at a time (one file worker, one part in flight), so
request N is the same point of the copy on every run.
"""

from __future__ import annotations

import os
import time
from typing import Any

import boto3
from botocore.config import Config

from retool.storage import TransferInterruptedError, TransferSettings, download_dir, upload_dir
from retool.storage.s3 import MiB

SETTINGS = TransferSettings(multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB, max_concurrency=1, file_workers=1, max_attempts=1, retry_backoff_seconds=0.01)
STALL_S = 0.3
EXIT_INTERRUPTED = 3

# Loaded once in the forkserver: a child's client then skips reading botocore's S3 model from disk.
_SESSION = boto3.session.Session()
_SESSION._session.get_service_model("s3")


def run(kind: str, src: str, dst: str, env: dict[str, str], stall_at: int, conn: Any) -> None:
    os.environ.update(env)
    # as retool.storage.make_client builds it, from the warm session
    client = _SESSION.client("s3", endpoint_url=env["AWS_ENDPOINT_URL_S3"], region_name=env["AWS_DEFAULT_REGION"], config=Config(retries={"max_attempts": 1, "mode": "standard"}))
    seen = 0

    def stall(request: Any, **_: Any) -> None:
        nonlocal seen
        seen += 1
        if seen == stall_at:
            conn.send(("stalled", f"{request.method} {request.url.split('?')[0].rsplit('/', 3)[-3:]}"))
            time.sleep(STALL_S)

    client.meta.events.register("before-send.s3", stall)
    copy = upload_dir if kind == "upload" else download_dir
    try:
        copy(src, dst, client=client, settings=SETTINGS)
    except TransferInterruptedError as exc:
        conn.send(("interrupted", str(exc)))
        os._exit(EXIT_INTERRUPTED)
    conn.send(("done", seen))
