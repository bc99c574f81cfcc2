"""Directory copies between local paths and a real S3-compatible server (moto, started by the tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from botocore.exceptions import EndpointConnectionError

from retool.storage import (
    MANIFEST_NAME,
    ChecksumMismatchError,
    LocalLocation,
    ManifestMissingError,
    S3Location,
    TransferSettings,
    download_dir,
    latest_checkpoint,
    make_client,
    parse_location,
    upload_dir,
)
from retool.storage.manifest import COPY_MARKER, PARTIAL_MARKER, sha256_file
from retool.storage.s3 import MiB
from retool.storage.steps import TRACKER_FILE, NoCheckpointError, choose_step, latest_step
from tests.conftest import repo_env

SMALL_MULTIPART = TransferSettings(multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB, max_concurrency=2, file_workers=2, max_attempts=2, retry_backoff_seconds=0.01)


def make_tree(root: Path, big_mib: int = 12) -> dict[str, bytes]:
    files = {
        "config.json": b'{"hidden_size": 8}',
        "tokenizer/vocab.txt": b"a\nb\nc\n",
        "tokenizer/empty.txt": b"",
        "shards/model-00001.safetensors": os.urandom(big_mib * MiB + 123),
        "shards/model-00002.safetensors": os.urandom(300_000),
    }
    for relative, data in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return files


def keys(s3, bucket: str, prefix: str = "") -> list[str]:
    return sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", []))


def local_files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("s3://ckpt/runs/a/", S3Location("ckpt", "runs/a"), id="s3 prefix, trailing slash dropped"),
        pytest.param("s3://ckpt", S3Location("ckpt", ""), id="bucket root"),
        pytest.param("/data/ns/run/models/rl", LocalLocation("/data/ns/run/models/rl"), id="PVC path"),
        pytest.param("relative/dir", LocalLocation("relative/dir"), id="relative path"),
    ],
)
def test_parse_location(value: str, expected) -> None:
    assert parse_location(value) == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        pytest.param("s3://UPPER/x", "not a valid S3 bucket name", id="bucket with capitals"),
        pytest.param("s3://ckpt/a/../b", "must not contain", id="dot-dot in prefix"),
        pytest.param("gs://bucket/x", "only s3:// URIs", id="other scheme"),
        pytest.param("", "empty location", id="empty"),
    ],
)
def test_parse_location_rejects(value: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_location(value)


@pytest.mark.parametrize(
    ("tracker", "complete", "expected"),
    [
        pytest.param("60", {30: True, 60: True, 90: True}, 60, id="tracker wins over a newer step"),
        pytest.param("60", {30: True, 60: False}, 30, id="tracker names an incomplete step: newest complete one"),
        pytest.param(None, {30: True, 120: True}, 120, id="no tracker: highest complete step"),
        pytest.param(None, {30: True, 120: False}, 30, id="no tracker: an incomplete newer step is skipped"),
        pytest.param("90", {30: True}, 30, id="tracker names a missing step"),
        pytest.param("sixty", {60: True}, 60, id="garbled tracker falls back"),
        pytest.param(None, {}, None, id="nothing saved yet"),
        pytest.param("5", {5: False}, None, id="only incomplete steps"),
    ],
)
def test_choose_step(tracker: str | None, complete: dict[int, bool], expected: int | None) -> None:
    assert choose_step(tracker, complete) == expected


def test_transfer_settings_refuse_parts_below_the_s3_minimum() -> None:
    with pytest.raises(ValueError, match="at least 5 MiB"):
        TransferSettings(multipart_chunksize=1 * MiB)


def test_round_trip_through_s3_with_multipart(tmp_path: Path, s3, bucket: str) -> None:
    files = make_tree(tmp_path / "src")
    report = upload_dir(str(tmp_path / "src"), f"s3://{bucket}/runs/a/model", settings=SMALL_MULTIPART)

    assert sorted(report.transferred) == sorted(files)
    assert report.bytes_transferred == sum(len(d) for d in files.values())
    assert keys(s3, bucket) == sorted([f"runs/a/model/{r}" for r in files] + [f"runs/a/model/{MANIFEST_NAME}"])
    big = s3.head_object(Bucket=bucket, Key="runs/a/model/shards/model-00001.safetensors")
    assert big["ETag"].strip('"').endswith("-3"), "12 MiB in 5 MiB parts is a three-part multipart upload"
    assert big["Metadata"]["sha256"] == sha256_file(str(tmp_path / "src/shards/model-00001.safetensors"))
    manifest = json.loads(s3.get_object(Bucket=bucket, Key=f"runs/a/model/{MANIFEST_NAME}")["Body"].read())
    assert manifest["files"]["config.json"]["size"] == len(files["config.json"])

    back = download_dir(f"s3://{bucket}/runs/a/model", str(tmp_path / "dst"), settings=SMALL_MULTIPART)
    assert sorted(back.transferred) == sorted(files)
    assert local_files(tmp_path / "dst") == {**files, MANIFEST_NAME: (tmp_path / "dst" / MANIFEST_NAME).read_bytes()}


def test_an_interrupted_upload_resumes_and_only_then_is_complete(tmp_path: Path, s3, bucket: str) -> None:
    files = make_tree(tmp_path / "src", big_mib=6)
    client = make_client(settings=SMALL_MULTIPART)
    failing = "ckpt/shards/model-00002.safetensors"

    def network_down(params, **_):
        if params.get("Key") == failing:
            raise EndpointConnectionError(endpoint_url="s3 (injected failure)")

    client.meta.events.register("before-parameter-build.s3.PutObject", network_down)
    with pytest.raises(EndpointConnectionError):
        upload_dir(str(tmp_path / "src"), f"s3://{bucket}/ckpt", client=client, settings=SMALL_MULTIPART)
    present = keys(s3, bucket)
    assert f"ckpt/{MANIFEST_NAME}" not in present, "an incomplete upload must not look complete"
    assert failing not in present
    with pytest.raises(ManifestMissingError, match="never completed"):
        download_dir(f"s3://{bucket}/ckpt", str(tmp_path / "early"), settings=SMALL_MULTIPART)

    uploaded_before = {relative for relative in files if f"ckpt/{relative}" in present}
    assert "config.json" in uploaded_before, "files before the failure were uploaded"

    resumed = upload_dir(str(tmp_path / "src"), f"s3://{bucket}/ckpt", settings=SMALL_MULTIPART)
    assert set(resumed.skipped) == uploaded_before, "objects already holding the right bytes are not sent again"
    assert set(resumed.transferred) == set(files) - uploaded_before
    assert f"ckpt/{MANIFEST_NAME}" in keys(s3, bucket)


def test_a_changed_source_is_reuploaded_and_verified(tmp_path: Path, s3, bucket: str) -> None:
    make_tree(tmp_path / "src", big_mib=1)
    upload_dir(str(tmp_path / "src"), f"s3://{bucket}/m", settings=SMALL_MULTIPART)
    (tmp_path / "src/config.json").write_bytes(b'{"hidden_size": 16}')
    again = upload_dir(str(tmp_path / "src"), f"s3://{bucket}/m", settings=SMALL_MULTIPART)
    assert again.transferred == ["config.json"]
    download_dir(f"s3://{bucket}/m", str(tmp_path / "dst"), settings=SMALL_MULTIPART)
    assert (tmp_path / "dst/config.json").read_bytes() == b'{"hidden_size": 16}'


def test_a_restarted_download_skips_verified_files_and_repairs_others(tmp_path: Path, bucket: str) -> None:
    files = make_tree(tmp_path / "src", big_mib=1)
    upload_dir(str(tmp_path / "src"), f"s3://{bucket}/m", settings=SMALL_MULTIPART)
    download_dir(f"s3://{bucket}/m", str(tmp_path / "dst"), settings=SMALL_MULTIPART)
    (tmp_path / "dst/tokenizer/vocab.txt").unlink()
    (tmp_path / "dst/config.json").write_bytes(b'{"hidden_size": 9}')  # same size, wrong bytes

    again = download_dir(f"s3://{bucket}/m", str(tmp_path / "dst"), settings=SMALL_MULTIPART)
    assert sorted(again.transferred) == ["config.json", "tokenizer/vocab.txt"]
    assert len(again.skipped) == len(files) - 2
    assert (tmp_path / "dst/config.json").read_bytes() == files["config.json"]


def test_a_corrupt_object_is_detected_and_never_lands_locally(tmp_path: Path, s3, bucket: str) -> None:
    files = make_tree(tmp_path / "src", big_mib=1)
    upload_dir(str(tmp_path / "src"), f"s3://{bucket}/m", settings=SMALL_MULTIPART)
    original = files["shards/model-00002.safetensors"]
    corrupt = bytes([original[0] ^ 0xFF]) + original[1:]
    s3.put_object(Bucket=bucket, Key="m/shards/model-00002.safetensors", Body=corrupt)

    with pytest.raises(ChecksumMismatchError, match=r"m/shards/model-00002\.safetensors: the manifest promises 300000 bytes with sha256"):
        download_dir(f"s3://{bucket}/m", str(tmp_path / "dst"), settings=SMALL_MULTIPART)
    landed = {p.relative_to(tmp_path / "dst").as_posix() for p in (tmp_path / "dst").rglob("*") if p.is_file()}
    assert "shards/model-00002.safetensors" not in landed
    assert MANIFEST_NAME not in landed, "an incomplete download must not look complete"
    assert not [name for name in landed if PARTIAL_MARKER in name], "no temporary file is left behind"


def test_pvc_to_pvc_copy_and_latest_checkpoint(tmp_path: Path) -> None:
    ckpt = tmp_path / "checkpoints"
    for step in (30, 60, 90):
        make_tree(ckpt / f"global_step_{step}", big_mib=0)
    (ckpt / "latest_checkpointed_iteration.txt").write_text("60")
    assert latest_checkpoint(str(ckpt)) == str(ckpt / "global_step_60")
    assert latest_checkpoint(str(tmp_path / "absent")) is None

    report = upload_dir(str(ckpt), str(tmp_path / "mirror"))
    assert (tmp_path / "mirror" / MANIFEST_NAME).is_file()
    assert local_files(tmp_path / "mirror").keys() - {MANIFEST_NAME} == local_files(ckpt).keys()
    assert len(report.transferred) == len(local_files(ckpt))
    assert latest_checkpoint(str(tmp_path / "mirror")) == str(tmp_path / "mirror" / "global_step_60")


def test_latest_checkpoint_on_s3(tmp_path: Path, bucket: str) -> None:
    for step in (5, 10):
        make_tree(tmp_path / "ckpt" / f"global_step_{step}", big_mib=0)
    (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").write_text("10\n")
    upload_dir(str(tmp_path / "ckpt"), f"s3://{bucket}/rl")
    assert latest_checkpoint(f"s3://{bucket}/rl") == f"s3://{bucket}/rl/global_step_10"
    assert latest_checkpoint(f"s3://{bucket}/nothing-here") is None


@pytest.mark.parametrize(
    ("call", "src", "dst", "message"),
    [
        pytest.param(upload_dir, "s3://b-x/a", "local/dir", "must be a local directory", id="upload from s3"),
        pytest.param(download_dir, "local/dir", "s3://b-x/a", "must be a local directory", id="download to s3"),
    ],
)
def test_direction_is_checked(call, src: str, dst: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call(src, dst)


def test_missing_local_source_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        upload_dir(str(tmp_path / "nope"), str(tmp_path / "out"))


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "retool.cli", "storage", *args], env=env, capture_output=True, text=True, timeout=120)


def test_cli_upload_download_and_a_clear_failure(tmp_path: Path, s3, bucket: str, s3_env: str) -> None:
    files = make_tree(tmp_path / "src", big_mib=0)
    env = repo_env(**{k: os.environ[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL_S3")})
    up = _cli("upload", str(tmp_path / "src"), f"s3://{bucket}/cli", "--json", env=env)
    assert up.returncode == 0, up.stderr
    assert json.loads(up.stdout)["transferred"] == len(files)

    down = _cli("download", f"s3://{bucket}/cli", str(tmp_path / "dst"), env=env)
    assert down.returncode == 0, down.stderr
    assert "transferred" in down.stdout

    s3.put_object(Bucket=bucket, Key="cli/config.json", Body=b"tampered")
    bad = _cli("download", f"s3://{bucket}/cli", str(tmp_path / "dst2"), env=env)
    assert bad.returncode == 1
    assert "cli/config.json: the manifest promises" in bad.stderr


# ------------------------------------------------------------------ checkpoints that are only half there


def make_checkpoints(root: Path, steps: tuple[int, ...] = (1, 2), shard_mib: int = 6, big_ranks: tuple[int, ...] = (0, 1)) -> dict[str, bytes]:
    """A verl RL checkpoint directory: per step two actor shards and a config, then the tracker.

    The shards of ``big_ranks`` in the last step are ``shard_mib`` MiB (multipart), the others a few KB.
    """
    files: dict[str, bytes] = {}
    for step in steps:
        for rank in (0, 1):
            size = shard_mib * MiB if step == steps[-1] and rank in big_ranks else 4096
            files[f"global_step_{step}/actor/model_world_size_2_rank_{rank}.pt"] = os.urandom(size + 7 * rank + step)
        files[f"global_step_{step}/actor/huggingface/config.json"] = f'{{"step": {step}}}'.encode()
    files[TRACKER_FILE] = str(steps[-1]).encode()
    for relative, data in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_bytes(data)
    return files


def failing_client(keys: set[str], operations: tuple[str, ...] = ("PutObject", "UploadPart", "GetObject")):
    """A client whose requests for ``keys`` fail as if the network went down (botocore gives up)."""
    client = make_client(settings=SMALL_MULTIPART)

    def network_down(params, **_):
        if params.get("Key") in keys:
            raise EndpointConnectionError(endpoint_url="s3 (injected failure)")

    for operation in operations:
        client.meta.events.register(f"before-parameter-build.s3.{operation}", network_down)
    return client


def test_the_tracker_is_uploaded_after_the_shards_and_an_unfinished_mirror_holds_no_checkpoint(tmp_path: Path, s3, bucket: str) -> None:
    make_checkpoints(tmp_path / "ckpt", steps=(1,), shard_mib=0)
    upload_dir(str(tmp_path / "ckpt"), f"s3://{bucket}/rl", settings=SMALL_MULTIPART)
    assert latest_checkpoint(f"s3://{bucket}/rl") == f"s3://{bucket}/rl/global_step_1"

    make_checkpoints(tmp_path / "ckpt", steps=(1, 2), shard_mib=6)
    client = failing_client({"rl/global_step_2/actor/model_world_size_2_rank_1.pt"})
    with pytest.raises(EndpointConnectionError):
        upload_dir(str(tmp_path / "ckpt"), f"s3://{bucket}/rl", client=client, settings=SMALL_MULTIPART)
    present = keys(s3, bucket, "rl/")
    assert f"rl/{MANIFEST_NAME}" not in present, "the old manifest is removed before anything is replaced"
    assert s3.get_object(Bucket=bucket, Key=f"rl/{TRACKER_FILE}")["Body"].read() == b"1", "the tracker is not sent before every shard is"
    assert latest_checkpoint(f"s3://{bucket}/rl") is None, "a mirror whose upload did not finish holds no checkpoint"
    assert s3.list_multipart_uploads(Bucket=bucket, Prefix="rl/").get("Uploads", []) == [], "failed multipart uploads are aborted"

    upload_dir(str(tmp_path / "ckpt"), f"s3://{bucket}/rl", settings=SMALL_MULTIPART)
    assert latest_checkpoint(f"s3://{bucket}/rl", required_subdir="actor") == f"s3://{bucket}/rl/global_step_2"


def test_a_mirror_missing_a_listed_shard_does_not_count_that_step(tmp_path: Path, s3, bucket: str) -> None:
    make_checkpoints(tmp_path / "ckpt", steps=(1, 2), shard_mib=0)
    upload_dir(str(tmp_path / "ckpt"), f"s3://{bucket}/rl", settings=SMALL_MULTIPART)
    s3.delete_object(Bucket=bucket, Key="rl/global_step_2/actor/model_world_size_2_rank_1.pt")
    assert latest_checkpoint(f"s3://{bucket}/rl") == f"s3://{bucket}/rl/global_step_1"
    s3.put_object(Bucket=bucket, Key="rl/global_step_1/actor/model_world_size_2_rank_0.pt", Body=b"truncated")
    assert latest_checkpoint(f"s3://{bucket}/rl") is None


def test_stale_multipart_uploads_under_the_prefix_are_aborted_by_the_next_upload(tmp_path: Path, s3, bucket: str) -> None:
    s3.create_multipart_upload(Bucket=bucket, Key="rl/global_step_1/actor/model_world_size_2_rank_0.pt")
    s3.create_multipart_upload(Bucket=bucket, Key="elsewhere/x.pt")
    make_checkpoints(tmp_path / "ckpt", steps=(1,), shard_mib=0)
    upload_dir(str(tmp_path / "ckpt"), f"s3://{bucket}/rl", settings=SMALL_MULTIPART)
    assert [u["Key"] for u in s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])] == ["elsewhere/x.pt"]


def test_a_download_that_fails_midway_leaves_a_directory_no_stage_resumes_from(tmp_path: Path, bucket: str) -> None:
    make_checkpoints(tmp_path / "ckpt", steps=(1,), shard_mib=0)
    upload_dir(str(tmp_path / "ckpt"), f"s3://{bucket}/rl", settings=SMALL_MULTIPART)
    dst = tmp_path / "pvc" / "rl"
    download_dir(f"s3://{bucket}/rl", str(dst), settings=SMALL_MULTIPART)
    assert latest_step(dst, "actor") == 1

    # the mirror moves on to step 2; a re-download into the older copy dies after some shards landed
    make_checkpoints(tmp_path / "ckpt", steps=(1, 2), shard_mib=6)
    upload_dir(str(tmp_path / "ckpt"), f"s3://{bucket}/rl", settings=SMALL_MULTIPART)
    client = failing_client({"rl/global_step_2/actor/model_world_size_2_rank_1.pt"}, operations=("GetObject", "HeadObject"))
    with pytest.raises(EndpointConnectionError):
        download_dir(f"s3://{bucket}/rl", str(dst), client=client, settings=SMALL_MULTIPART)
    assert (dst / COPY_MARKER).is_file() and not (dst / MANIFEST_NAME).exists()
    assert not [p for p in dst.rglob("*") if PARTIAL_MARKER in p.name], "partial files of the failed file are removed"
    with pytest.raises(NoCheckpointError, match="unfinished copy"):
        latest_step(dst, "actor")
    assert latest_checkpoint(str(dst)) is None

    again = download_dir(f"s3://{bucket}/rl", str(dst), settings=SMALL_MULTIPART)
    assert "global_step_1/actor/model_world_size_2_rank_0.pt" in again.skipped
    assert not (dst / COPY_MARKER).exists()
    assert latest_step(dst, "actor") == 2


def test_a_copied_checkpoint_with_a_shard_gone_is_not_resumed_from(tmp_path: Path) -> None:
    make_checkpoints(tmp_path / "ckpt", steps=(1, 2), shard_mib=0)
    upload_dir(str(tmp_path / "ckpt"), str(tmp_path / "copy"))
    assert latest_step(tmp_path / "copy", "actor") == 2
    (tmp_path / "copy/global_step_2/actor/model_world_size_2_rank_0.pt").unlink()
    assert latest_step(tmp_path / "copy", "actor") == 1, "the manifest lists the shard, so step 2 is incomplete"
    (tmp_path / "copy/global_step_1/actor/model_world_size_2_rank_1.pt").write_bytes(b"short")
    with pytest.raises(NoCheckpointError, match="no complete checkpoint"):
        latest_step(tmp_path / "copy", "actor")


def test_a_step_of_a_mirror_downloads_through_the_enclosing_manifest(tmp_path: Path, bucket: str) -> None:
    files = make_checkpoints(tmp_path / "ckpt", steps=(1, 2), shard_mib=0)
    upload_dir(str(tmp_path / "ckpt"), f"s3://{bucket}/rl", settings=SMALL_MULTIPART)
    uri = latest_checkpoint(f"s3://{bucket}/rl")
    assert uri == f"s3://{bucket}/rl/global_step_2"
    report = download_dir(uri, str(tmp_path / "step"), settings=SMALL_MULTIPART)
    expected = {rel.removeprefix("global_step_2/"): data for rel, data in files.items() if rel.startswith("global_step_2/")}
    assert sorted(report.transferred) == sorted(expected)
    assert {k: v for k, v in local_files(tmp_path / "step").items() if k != MANIFEST_NAME} == expected
    with pytest.raises(ManifestMissingError):
        download_dir(f"s3://{bucket}/rl/global_step_9", str(tmp_path / "none"), settings=SMALL_MULTIPART)


def test_an_unfinished_copy_is_not_copied_on(tmp_path: Path) -> None:
    make_checkpoints(tmp_path / "ckpt", steps=(1,), shard_mib=0)
    (tmp_path / "ckpt" / COPY_MARKER).write_text("copy in progress")
    with pytest.raises(ValueError, match="unfinished copy"):
        upload_dir(str(tmp_path / "ckpt"), str(tmp_path / "out"))
