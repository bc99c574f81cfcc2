"""Reading sources: local files and directories, s3:// from a real S3-compatible server, hub ids."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from retool.data import prepare_eval, prepare_rl
from retool.data.sources import S3Location, SourceError, classify_source, iter_batches, parse_s3_uri
from tests.conftest import free_port
from tests.data.helpers import dapo_row, read_rows, write_jsonl, write_parquet


@pytest.mark.parametrize(
    ("source", "on_disk", "kind"),
    [
        pytest.param("s3://bucket/data/train.parquet", False, "s3", id="s3 uri"),
        pytest.param("/data/sets/dapo.parquet", False, "local", id="absolute path"),
        pytest.param("./dapo", False, "local", id="relative path"),
        pytest.param("dapo.jsonl", False, "local", id="bare file name"),
        pytest.param("BytedTsinghua-SIA/DAPO-Math-17k", False, "hub", id="hub id"),
        pytest.param("data/train", True, "local", id="an existing directory wins over a hub id"),
    ],
)
def test_classify_source(source: str, on_disk: bool, kind: str) -> None:
    assert classify_source(source, exists=lambda _: on_disk) == kind


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("", "empty data source"),
        ("not a source", "data source 'not a source' is neither an existing path, an s3:// URI nor a hub id (org/name)"),
        ("a/b/c", "data source 'a/b/c' is neither an existing path, an s3:// URI nor a hub id (org/name)"),
    ],
    ids=["empty", "spaces", "three parts"],
)
def test_unknown_sources_are_rejected(source: str, message: str) -> None:
    with pytest.raises(SourceError, match=re.escape(message)):
        classify_source(source, exists=lambda _: False)


@pytest.mark.parametrize(
    ("uri", "bucket", "key"),
    [
        ("s3://bucket/a/b.parquet", "bucket", "a/b.parquet"),
        ("s3://bucket", "bucket", ""),
        ("s3://bucket/", "bucket", ""),
        ("s3://bucket/p/", "bucket", "p/"),
        ("s3://my-bucket.v2/deep/er/x.jsonl", "my-bucket.v2", "deep/er/x.jsonl"),
    ],
    ids=["a key with folders", "a bare bucket", "a bucket with its slash", "a prefix keeps its trailing slash", "dots and dashes in the bucket"],
)
def test_parse_s3_uri(uri: str, bucket: str, key: str) -> None:
    assert parse_s3_uri(uri) == S3Location(bucket=bucket, key=key)


@pytest.mark.parametrize(
    "uri",
    ["s3://", "s3:///key", "S3://bucket/key", "https://bucket/key", "bucket/key"],
    ids=["no bucket", "an empty bucket", "an upper-case scheme", "another scheme", "no scheme"],
)
def test_a_malformed_s3_uri_is_an_error_naming_it(uri: str) -> None:
    with pytest.raises(SourceError, match=re.escape(f"malformed S3 URI {uri!r}: expected s3://bucket/key")):
        parse_s3_uri(uri)


def test_directory_of_parquet_and_jsonl(tmp_path) -> None:
    write_parquet(tmp_path / "sets" / "a.parquet", [dapo_row("P1", "1"), dapo_row("P2", "2")])
    write_jsonl(tmp_path / "sets" / "nested" / "b.jsonl", [dapo_row("P3", "3"), "{oops"])
    (tmp_path / "sets" / "README.md").write_text("not data")
    summary = prepare_rl(str(tmp_path / "sets"), str(tmp_path / "rl.parquet"), max_malformed_fraction=1.0)  # counting, not the limit
    assert (summary.rows_read, summary.rows_written, summary.malformed) == (4, 3, 1)
    assert summary.malformed_examples[0].where == f"{tmp_path / 'sets' / 'nested' / 'b.jsonl'}#2"
    assert [r["reward_model"]["ground_truth"] for r in read_rows(tmp_path / "rl.parquet")] == ["1", "2", "3"]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        pytest.param(lambda root: root / "missing.parquet", "no such file or directory", id="missing file"),
        pytest.param(lambda root: (root / "empty").mkdir() or root / "empty", "holds no .parquet or .jsonl files", id="empty directory"),
        pytest.param(lambda root: (root / "x.csv").write_text("a") and root / "x.csv", "unsupported file type", id="csv file"),
        pytest.param(lambda root: (root / "x.parquet").write_text("not parquet") and root / "x.parquet", "not a readable parquet file", id="corrupt parquet"),
    ],
)
def test_unreadable_local_sources(tmp_path, make, message: str) -> None:
    path = make(tmp_path)
    with pytest.raises(SourceError, match=message):
        list(iter_batches(str(path)))
    assert not (tmp_path / "out.parquet").exists()


def test_hub_id_goes_to_datasets_load_dataset_streaming(tmp_path, monkeypatch) -> None:
    """No network: load_dataset is wrapped to record its arguments and read a local directory instead."""
    import datasets

    write_parquet(tmp_path / "hub" / "data" / "train-00000.parquet", [{"ID": "2024-I-1", "Problem": "Find x.", "Answer": 7}])
    real, calls = datasets.load_dataset, []

    def recording(path, name=None, **kwargs):
        calls.append((path, name, kwargs))
        return real(str(tmp_path / "hub"), name, **kwargs)

    monkeypatch.setattr(datasets, "load_dataset", recording)
    summary = prepare_eval("Maxwell-Jia/AIME_2024", str(tmp_path / "aime.parquet"), name="aime_2024")
    assert calls == [("Maxwell-Jia/AIME_2024", None, {"split": "train", "streaming": True})]
    assert summary.rows_written == 1 and summary.source == "Maxwell-Jia/AIME_2024"
    assert read_rows(tmp_path / "aime.parquet")[0]["extra_info"]["source_id"] == "2024-I-1"


def test_hub_failure_is_a_source_error(monkeypatch) -> None:
    import datasets

    def unreachable(*args, **kwargs):
        raise ConnectionError("hub unreachable")

    monkeypatch.setattr(datasets, "load_dataset", unreachable)
    with pytest.raises(SourceError, match="hub dataset 'org/name' \\(split 'test'\\): hub unreachable"):
        list(iter_batches("org/name", split="test"))


@pytest.fixture(scope="module")
def s3_endpoint():
    """A real S3-compatible server (moto's server mode) on loopback, for the whole module."""
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(endpoint, timeout=1)
            break
        except httpx.TransportError:
            if time.monotonic() > deadline or process.poll() is not None:
                process.kill()
                pytest.fail("moto server did not start")
            time.sleep(0.2)
    yield endpoint
    process.terminate()
    process.wait(timeout=10)


@pytest.fixture
def s3(s3_endpoint, monkeypatch, tmp_path):
    """Credentials from the environment (the standard chain), a fresh bucket with DAPO data in it."""
    import boto3

    for name, value in {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    client = boto3.client("s3", endpoint_url=s3_endpoint)
    bucket = f"retool-{tmp_path.name.lower().replace('_', '-')[-40:]}".rstrip("-")
    client.create_bucket(Bucket=bucket)
    parquet = write_parquet(tmp_path / "up" / "dapo.parquet", [dapo_row(f"P{i}", str(i)) for i in range(4)] * 3)
    jsonl = write_jsonl(tmp_path / "up" / "more.jsonl", [dapo_row("P9", "9"), "{bad"])
    client.upload_file(str(parquet), bucket, "sets/dapo.parquet")
    client.upload_file(str(jsonl), bucket, "sets/more.jsonl")
    client.put_object(Bucket=bucket, Key="sets/notes.txt", Body=b"ignored")
    return bucket, s3_endpoint


def test_s3_object_with_explicit_endpoint(s3, tmp_path) -> None:
    bucket, endpoint = s3
    summary = prepare_rl(f"s3://{bucket}/sets/dapo.parquet", str(tmp_path / "out" / "rl.parquet"), s3_endpoint=endpoint)
    assert (summary.rows_read, summary.rows_written, summary.duplicates) == (12, 4, 8)
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["rl.parquet"]  # the download scratch beside it is gone


def test_s3_prefix_with_endpoint_from_environment(s3, tmp_path, monkeypatch) -> None:
    bucket, endpoint = s3
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    summary = prepare_rl(f"s3://{bucket}/sets", str(tmp_path / "rl.parquet"), max_malformed_fraction=0.1)
    assert (summary.rows_read, summary.rows_written, summary.malformed) == (14, 5, 1)
    assert summary.malformed_examples[0].where == f"s3://{bucket}/sets/more.jsonl#2"


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        pytest.param("s3://{bucket}/nothing/here.parquet", "no such object", id="missing key"),
        pytest.param("s3://{bucket}/sets/notes.txt", "unsupported object type", id="not a data object"),
        pytest.param("s3://no-such-bucket-retool/x.parquet", "NoSuchBucket", id="missing bucket"),
    ],
)
def test_s3_errors_name_the_object(s3, tmp_path, uri: str, message: str) -> None:
    bucket, endpoint = s3
    with pytest.raises(SourceError, match=message):
        prepare_rl(uri.format(bucket=bucket), str(tmp_path / "rl.parquet"), s3_endpoint=endpoint)
    assert not Path(tmp_path / "rl.parquet").exists()
