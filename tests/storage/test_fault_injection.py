"""Fault injection: kill real processes copying checkpoints at every request they make.

For every request index N of an upload (PVC -> moto S3) and of a download (S3 -> PVC), a fresh
process starts the copy, stalls at request N, and is killed there: SIGKILL (nothing can clean up)
or SIGTERM (a pod being deleted: the copy cancels and cleans up). After each kill the next stage's
view is checked the way it resumes: ``latest_checkpoint`` on the mirror, ``latest_step`` (the
stage entrypoint's rule) on the PVC. Either no checkpoint counts, or the one that counts holds
exactly the source's bytes. Then a rerun must complete, leaving no partial file and no open
multipart upload behind.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import signal
from pathlib import Path

import pytest

from retool.storage import COPY_MARKER, download_dir, latest_checkpoint, upload_dir
from retool.storage.manifest import PARTIAL_MARKER
from retool.storage.steps import TRACKER_FILE, NoCheckpointError, latest_step
from tests.storage import fault_child
from tests.storage.servers import aws_env
from tests.storage.test_storage import make_checkpoints

pytestmark = pytest.mark.slow

MAX_POINTS = 40
SIGNALS = (signal.SIGKILL, signal.SIGTERM)


@pytest.fixture(scope="module")
def forkserver() -> multiprocessing.context.BaseContext:
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["boto3", "botocore", "s3transfer", "retool.storage", "tests.storage.fault_child"])
    return ctx


@pytest.fixture
def trees(tmp_path: Path) -> tuple[Path, Path, dict[str, bytes]]:
    """``full``: steps 1 and 2 as verl leaves them; ``old``: the same directory when only step 1 existed."""
    full, old = tmp_path / "full", tmp_path / "old"
    files = make_checkpoints(full, steps=(1, 2), shard_mib=6, big_ranks=(0,))  # one multipart shard (two 5 MiB parts)
    shutil.copytree(full / "global_step_1", old / "global_step_1")
    (old / TRACKER_FILE).write_text("1")
    return full, old, files


def kill_at(ctx, kind: str, src: str, dst: str, env: dict[str, str], point: int, sig: signal.Signals) -> str:
    """Run one copy that stalls at request ``point`` and kill it there; 'completed' when it had fewer requests."""
    receiver, sender = ctx.Pipe(duplex=False)
    process = ctx.Process(target=fault_child.run, args=(kind, src, dst, env, point, sender), daemon=True)
    process.start()
    sender.close()
    try:
        assert receiver.poll(60), f"{kind} child made no progress"
        message = receiver.recv()
        if message[0] == "done":
            process.join(30)
            assert process.exitcode == 0
            return "completed"
        assert message[0] == "stalled", message
        os.kill(process.pid, sig)
        process.join(30)
        assert not process.is_alive(), f"{kind} child survived {sig.name}"
        if sig == signal.SIGTERM:
            assert process.exitcode == fault_child.EXIT_INTERRUPTED, f"SIGTERM at {message[1]}: exit code {process.exitcode}, not a clean interruption"
        return f"{sig.name} at request {point} ({message[1]})"
    finally:
        if process.is_alive():
            process.kill()
        receiver.close()


def step_files(files: dict[str, bytes], step: int) -> dict[str, bytes]:
    head = f"global_step_{step}/"
    return {rel[len(head) :]: data for rel, data in files.items() if rel.startswith(head)}


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def partials(root: Path) -> list[str]:
    return [p.name for p in root.rglob("*") if PARTIAL_MARKER in p.name]


def open_uploads(s3, bucket: str, prefix: str) -> list[str]:
    return [u["Key"] for u in s3.list_multipart_uploads(Bucket=bucket, Prefix=prefix).get("Uploads", [])]


def copy_prefix(s3, bucket: str, src: str, dst: str) -> None:
    """Server-side copy of every object under ``src/`` to ``dst/`` (metadata included)."""
    for obj in s3.list_objects_v2(Bucket=bucket, Prefix=f"{src}/")["Contents"]:
        s3.copy_object(Bucket=bucket, Key=f"{dst}/{obj['Key'][len(src) + 1 :]}", CopySource={"Bucket": bucket, "Key": obj["Key"]})


def test_killed_uploads_never_leave_a_mirror_that_resumes_from_a_partial_checkpoint(forkserver, trees, tmp_path: Path, s3, bucket: str, s3_endpoint: str) -> None:
    full, old, files = trees
    env = aws_env(s3_endpoint)
    upload_dir(str(old), f"s3://{bucket}/old", settings=fault_child.SETTINGS)
    outcomes = []
    for point in range(1, MAX_POINTS + 1):
        uri = f"s3://{bucket}/up{point}"
        copy_prefix(s3, bucket, "old", f"up{point}")  # the mirror of the previous stage attempt
        sig = SIGNALS[point % 2]
        outcome = kill_at(forkserver, "upload", str(full), uri, env, point, sig)
        outcomes.append(outcome)

        found = latest_checkpoint(uri, required_subdir="actor")
        if found is not None:
            step = int(found.rsplit("_", 1)[1])
            got = download_dir(found, str(tmp_path / f"check-up{point}"), settings=fault_child.SETTINGS)
            assert got.transferred, found
            landed = {k: v for k, v in tree(tmp_path / f"check-up{point}").items() if not k.startswith(".retool")}
            assert landed == step_files(files, step), f"after {outcome}: {found} counts but does not hold the source's step {step}"
        if sig == signal.SIGTERM or outcome == "completed":
            assert open_uploads(s3, bucket, f"up{point}/") == [], f"after {outcome}: multipart uploads left open"

        if sig == signal.SIGKILL or outcome == "completed":
            if outcome != "completed":  # nothing cleaned up: the rerun completes and cleans up
                upload_dir(str(full), uri, settings=fault_child.SETTINGS)
            assert latest_checkpoint(uri, required_subdir="actor") == f"{uri}/global_step_2"
            assert open_uploads(s3, bucket, f"up{point}/") == []
        if outcome == "completed":
            break
    assert outcomes[-1] == "completed", "the points cover the whole upload"
    assert len(outcomes) >= 12, outcomes


def test_killed_downloads_never_leave_a_pvc_directory_the_stage_resumes_from(forkserver, trees, tmp_path: Path, bucket: str, s3_endpoint: str) -> None:
    full, old, files = trees
    env = aws_env(s3_endpoint)
    upload_dir(str(old), f"s3://{bucket}/old", settings=fault_child.SETTINGS)
    upload_dir(str(full), f"s3://{bucket}/mirror", settings=fault_child.SETTINGS)
    old_copy = tmp_path / "old-copy"
    download_dir(f"s3://{bucket}/old", str(old_copy), settings=fault_child.SETTINGS)
    outcomes = []
    for point in range(1, MAX_POINTS + 1):
        dst = tmp_path / f"pvc{point}"
        shutil.copytree(old_copy, dst)  # an older copy on the PVC
        sig = SIGNALS[point % 2]
        outcome = kill_at(forkserver, "download", f"s3://{bucket}/mirror", str(dst), env, point, sig)
        outcomes.append(outcome)

        try:
            step = latest_step(dst, "actor")
        except NoCheckpointError:
            assert (dst / COPY_MARKER).exists(), f"after {outcome}: refused without the copy marker"
        else:
            on_disk = {k: v for k, v in tree(dst / f"global_step_{step}").items() if PARTIAL_MARKER not in k}
            assert on_disk == step_files(files, step), f"after {outcome}: the stage would resume from an incomplete global_step_{step}"
            assert latest_checkpoint(str(dst)) == str(dst / f"global_step_{step}")
        if sig == signal.SIGTERM or outcome == "completed":
            assert partials(dst) == [], f"after {outcome}: partial files left behind"

        if sig == signal.SIGKILL or outcome == "completed":
            if outcome != "completed":  # nothing cleaned up: the rerun completes and cleans up
                download_dir(f"s3://{bucket}/mirror", str(dst), settings=fault_child.SETTINGS)
            assert partials(dst) == [] and not (dst / COPY_MARKER).exists()
            assert latest_step(dst, "actor") == 2
            assert {k: v for k, v in tree(dst).items() if not k.startswith(".retool")} == files
        if outcome == "completed":
            break
    assert outcomes[-1] == "completed", "the points cover the whole download"
    assert len(outcomes) >= 8, outcomes
