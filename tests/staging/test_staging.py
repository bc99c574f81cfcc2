"""Model staging onto the PVC: hub (through a local hub that speaks huggingface_hub's protocol),
s3:// (moto's server) and PVC paths; resumable, verified, and what the later stages read."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from retool.recipe.render.stages import render_stage
from retool.runtime.paths import run_paths, staged_model_path
from retool.spec.validate import parse_run
from retool.staging import STAGED_MANIFEST, StagingError, read_staged, stage_model, staging_plan
from retool.staging.plan import check_model_files, select_files
from tests.conftest import repo_env
from tests.render.cases import context_of, load_example
from tests.staging.fake_hub import FakeHub, FakeRepo

REPO_ID = "tiny-org/tiny-qwen"
STAGED = {"config.json", "generation_config.json", "model.safetensors", "README.md", ".gitattributes"}


def spec_doc(tmp_path: Path, model: dict) -> dict:
    doc = load_example("minimal")
    doc["spec"].setdefault("storage", {}).setdefault("pvc", {})["mountPath"] = str(tmp_path / "pvc")
    doc["spec"]["model"] = model
    return doc


def stage_cli(tmp_path: Path, doc: dict, **env: str) -> subprocess.CompletedProcess[str]:
    spec = tmp_path / "run.yaml"
    spec.write_text(yaml.safe_dump(doc))
    environ = repo_env(**env)
    environ.pop("HF_TOKEN", None) if "HF_TOKEN" not in env else None
    return subprocess.run([sys.executable, "-m", "retool.staging", "--spec", str(spec)], env=environ, capture_output=True, text=True, timeout=180, check=False)


def staged_files(destination: str) -> dict[str, bytes]:
    root = Path(destination)
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file() and ".cache" not in p.parts and p.name != STAGED_MANIFEST}


# ------------------------------------------------------------------------------ pure parts


@pytest.mark.parametrize(
    ("model", "storage_s3", "expected"),
    [
        pytest.param({"base": "Qwen/Qwen2.5-7B-Instruct"}, None, ("hub", "Qwen/Qwen2.5-7B-Instruct", None, None), id="hub-id-default-revision"),
        pytest.param(
            {"base": "Qwen/Qwen2.5-7B-Instruct", "revision": "v1.0", "hubEndpoint": "https://hf-mirror.example"},
            None,
            ("hub", "Qwen/Qwen2.5-7B-Instruct", "v1.0", "https://hf-mirror.example"),
            id="hub-id-revision-through-a-mirror",
        ),
        pytest.param(
            {"base": "s3://models/qwen/7b/"},
            {"uri": "s3://ckpt/runs", "endpoint": "http://minio:9000"},
            ("s3", "s3://models/qwen/7b", None, "http://minio:9000"),
            id="s3-prefix-run-endpoint",
        ),
    ],
)
def test_staging_plan_copies_hub_and_s3_models_to_models_base(tmp_path: Path, model: dict, storage_s3: dict | None, expected: tuple) -> None:
    doc = spec_doc(tmp_path, model)
    if storage_s3:
        doc["spec"].setdefault("storage", {})["s3"] = storage_s3
    run = parse_run(doc)
    plan = staging_plan(run)
    assert (plan.kind, plan.source, plan.revision, plan.endpoint) == expected
    assert plan.destination == run_paths(run).base_model == staged_model_path(run)


def test_a_pvc_path_is_read_in_place(tmp_path: Path) -> None:
    run = parse_run(spec_doc(tmp_path, {"base": "/data/models/qwen"}))
    plan = staging_plan(run)
    assert (plan.kind, plan.copies, plan.destination) == ("pvc", False, "/data/models/qwen")
    assert staged_model_path(run) == "/data/models/qwen"


@pytest.mark.parametrize(
    ("names", "kept"),
    [
        pytest.param(["config.json", "model.safetensors", "pytorch_model.bin", "flax_model.msgpack"], ["config.json", "model.safetensors"], id="safetensors-wins"),
        pytest.param(["config.json", "pytorch_model.bin"], ["config.json", "pytorch_model.bin"], id="bin-only-model-keeps-its-bin"),
        pytest.param(
            ["original/consolidated.pth", "model-00001-of-00002.safetensors", "tokenizer.json"], ["model-00001-of-00002.safetensors", "tokenizer.json"], id="original-pth-skipped"
        ),
    ],
)
def test_select_files(names: list[str], kept: list[str]) -> None:
    assert select_files(names) == sorted(kept)


@pytest.mark.parametrize(
    ("names", "message"),
    [(["model.safetensors"], "no config.json"), (["config.json", "README.md"], "no weights")],
)
def test_a_directory_without_a_model_is_refused(names: list[str], message: str) -> None:
    with pytest.raises(StagingError, match=message):
        check_model_files(names, "somewhere")


# ------------------------------------------------------------------------------ hub


@pytest.mark.slow
def test_hub_model_is_staged_verified_and_loadable_offline(tmp_path: Path, model_files: dict[str, bytes]) -> None:
    repo = FakeRepo(REPO_ID, model_files, tags={"v1": ""})
    with FakeHub(repo) as hub:
        doc = spec_doc(tmp_path, {"base": REPO_ID, "revision": "v1", "hubEndpoint": hub.url})
        result = stage_cli(tmp_path, doc)
        assert result.returncode == 0, result.stderr[-3000:]
        run = parse_run(doc)
        destination = staged_model_path(run)
        assert staged_files(destination) == {name: model_files[name] for name in STAGED}, "every file but the duplicate .bin weights, byte for byte"
        staged = read_staged(destination)
        assert staged is not None and (staged.source, staged.revision, staged.commit) == (REPO_ID, "v1", repo.commit)
        assert staged.files["model.safetensors"].sha256 is not None and staged.files["config.json"].git_sha1 is not None
        # once staged, a retry of the prepare stage downloads nothing
        hub.requests.clear()
        assert stage_cli(tmp_path, doc).returncode == 0
        assert hub.requests == []
    # what the later stages do with it: transformers loads it with the hub unreachable
    probe = "import sys; from transformers import AutoModelForCausalLM; m = AutoModelForCausalLM.from_pretrained(sys.argv[1]); print(m.config.model_type)"
    loaded = subprocess.run([sys.executable, "-c", probe, destination], env=repo_env(HF_HUB_OFFLINE="1"), capture_output=True, text=True, timeout=120, check=False)
    assert loaded.stdout.strip() == "qwen2", loaded.stderr[-2000:]


@pytest.mark.slow
def test_an_interrupted_hub_download_resumes_from_its_partial_bytes(tmp_path: Path, model_files: dict[str, bytes]) -> None:
    # huggingface_hub writes in 10 MiB chunks: a shard of 24 MiB cut at 16 MiB leaves 10 MiB behind.
    files = {**model_files, "model.safetensors": os.urandom(24 << 20)}
    with FakeHub(FakeRepo(REPO_ID, files)) as hub:
        doc = spec_doc(tmp_path, {"base": REPO_ID, "hubEndpoint": hub.url})
        destination = staged_model_path(parse_run(doc))
        hub.cut("model.safetensors", 16 << 20)
        first = stage_cli(tmp_path, doc)
        assert first.returncode == 1 and "cannot stage the model" in first.stderr
        assert read_staged(destination) is None and not (Path(destination) / "model.safetensors").exists()
        assert hub.ranges("model.safetensors") == [None]
        hub.heal()
        second = stage_cli(tmp_path, doc)
        assert second.returncode == 0, second.stderr[-3000:]
        [resumed] = hub.ranges("model.safetensors")
        assert resumed == f"bytes={10 << 20}-", "the second attempt asks only for the bytes it does not have"
        assert (Path(destination) / "model.safetensors").read_bytes() == files["model.safetensors"]


@pytest.mark.slow
def test_corrupt_bytes_fail_the_staging_and_are_not_kept(tmp_path: Path, model_files: dict[str, bytes]) -> None:
    with FakeHub(FakeRepo(REPO_ID, model_files)) as hub:
        doc = spec_doc(tmp_path, {"base": REPO_ID, "hubEndpoint": hub.url})
        destination = staged_model_path(parse_run(doc))
        hub.corrupt("model.safetensors")
        failed = stage_cli(tmp_path, doc)
        assert failed.returncode == 1
        assert "model.safetensors: sha256" in failed.stderr and "differs from the hub's" in failed.stderr
        assert read_staged(destination) is None and not (Path(destination) / "model.safetensors").exists()
        hub.heal()
        assert stage_cli(tmp_path, doc).returncode == 0
        assert (Path(destination) / "model.safetensors").read_bytes() == model_files["model.safetensors"]


@pytest.mark.slow
def test_gated_model_needs_the_token_from_the_secret(tmp_path: Path, model_files: dict[str, bytes]) -> None:
    with FakeHub(FakeRepo(REPO_ID, model_files, token="hf_secret")) as hub:
        doc = spec_doc(tmp_path, {"base": REPO_ID, "hubEndpoint": hub.url, "tokenSecretRef": {"name": "hf-token"}})
        refused = stage_cli(tmp_path, doc)
        assert refused.returncode == 1 and "spec.model.tokenSecretRef" in refused.stderr
        allowed = stage_cli(tmp_path, doc, HF_TOKEN="hf_secret")
        assert allowed.returncode == 0, allowed.stderr[-3000:]


def test_unknown_revision_is_named(tmp_path: Path, model_files: dict[str, bytes]) -> None:
    with FakeHub(FakeRepo(REPO_ID, model_files)) as hub:
        run = parse_run(spec_doc(tmp_path, {"base": REPO_ID, "revision": "no-such-tag", "hubEndpoint": hub.url}))
        with pytest.raises(StagingError, match=r"model\.revision 'no-such-tag' does not exist"):
            stage_model(staging_plan(run))
        assert not Path(staged_model_path(run), STAGED_MANIFEST).exists()


def test_a_new_source_replaces_the_staged_model(tmp_path: Path, model_files: dict[str, bytes]) -> None:
    other = {**model_files, "config.json": model_files["config.json"].replace(b'"hidden_size": 16', b'"hidden_size": 16 ')}
    with FakeHub(FakeRepo(REPO_ID, model_files), FakeRepo("tiny-org/other", other)) as hub:
        first = parse_run(spec_doc(tmp_path, {"base": REPO_ID, "hubEndpoint": hub.url}))
        stage_model(staging_plan(first))
        Path(staged_model_path(first), "stale.txt").write_text("from the first model")
        second = parse_run(spec_doc(tmp_path, {"base": "tiny-org/other", "hubEndpoint": hub.url}))
        staged = stage_model(staging_plan(second))
        assert staged.source == "tiny-org/other"
        assert not Path(staged_model_path(second), "stale.txt").exists()
        assert Path(staged_model_path(second), "config.json").read_bytes() == other["config.json"]


# ------------------------------------------------------------------------------ s3 and pvc


@pytest.mark.slow
def test_s3_model_is_copied_and_checked_against_what_s3_reports(tmp_path: Path, model_files: dict[str, bytes]) -> None:
    import boto3

    from tests.storage.servers import DUMMY_AWS, moto_server

    with moto_server(tmp_path) as endpoint, pytest.MonkeyPatch.context() as mp:
        for key, value in DUMMY_AWS.items():
            mp.setenv(key, value)
        s3 = boto3.client("s3", endpoint_url=endpoint)
        s3.create_bucket(Bucket="models")
        for name, data in model_files.items():
            s3.put_object(Bucket="models", Key=f"qwen/tiny/{name}", Body=data)
        doc = spec_doc(tmp_path, {"base": "s3://models/qwen/tiny"})
        doc["spec"].setdefault("storage", {})["s3"] = {"uri": "s3://ckpt/runs", "endpoint": endpoint}
        run = parse_run(doc)
        staged = stage_model(staging_plan(run))
        assert staged_files(staged_model_path(run)) == {name: model_files[name] for name in STAGED}
        assert read_staged(staged_model_path(run)) == staged
        # an object whose bytes contradict its sha256 metadata is refused, and the staged copy stops counting
        s3.put_object(Bucket="models", Key="qwen/other/config.json", Body=model_files["config.json"], Metadata={"sha256": "0" * 64})
        s3.put_object(Bucket="models", Key="qwen/other/model.safetensors", Body=model_files["model.safetensors"])
        doc["spec"]["model"]["base"] = "s3://models/qwen/other"
        other = parse_run(doc)
        with pytest.raises(StagingError, match=r"config\.json: sha256 .* differs from the object's sha256 metadata"):
            stage_model(staging_plan(other))
        assert read_staged(staged_model_path(other)) is None


def test_pvc_model_is_checked_in_place(tmp_path: Path, model_files: dict[str, bytes]) -> None:
    model_dir = tmp_path / "pvc" / "models" / "mine"
    model_dir.mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):
        (model_dir / name).write_bytes(model_files[name])
    run = parse_run(spec_doc(tmp_path, {"base": str(model_dir)}))
    staged = stage_model(staging_plan(run))
    assert staged.kind == "pvc" and set(staged.files) == {"config.json", "model.safetensors"}
    assert not (model_dir / STAGED_MANIFEST).exists(), "the user's directory is not written to"
    missing = parse_run(spec_doc(tmp_path, {"base": str(tmp_path / "pvc" / "nothing")}))
    with pytest.raises(StagingError, match="does not exist on the run's PVC"):
        stage_model(staging_plan(missing))


# ------------------------------------------------------------------------------ what the stages render


def test_prepare_stages_the_model_after_the_data_through_the_hub_endpoint(tmp_path: Path) -> None:
    run = parse_run(spec_doc(tmp_path, {"base": REPO_ID, "hubEndpoint": "https://hf-mirror.example", "tokenSecretRef": {"name": "hf"}}))
    command = render_stage(run, "prepare", context_of(run), spec_file="/etc/retool/run.yaml")
    assert command.pre == (("python3", "-m", "retool.runtime.cpu_only", "-m", "retool.cli", "data", "prepare", "all", "--spec", "/etc/retool/run.yaml"),)
    assert command.argv == ("python3", "-m", "retool.runtime.cpu_only", "-m", "retool.staging", "--spec", "/etc/retool/run.yaml")
    assert command.env["HF_ENDPOINT"] == "https://hf-mirror.example" and "HF_HUB_OFFLINE" not in command.env
    assert any("Secret hf (key HF_TOKEN)" in note for note in command.notes)


@pytest.mark.parametrize(
    ("model", "sft", "stage", "key"),
    [
        pytest.param({"base": "s3://models/qwen-7b"}, True, "sft", "model.partial_pretrain", id="sft-reads-the-staged-s3-model"),
        pytest.param({"base": REPO_ID, "revision": "v1"}, True, "sft", "model.partial_pretrain", id="sft-reads-the-staged-revision"),
        pytest.param({"base": REPO_ID}, False, "rl", "actor_rollout_ref.model.path", id="rl-without-sft-reads-the-staged-model"),
    ],
)
def test_later_stages_read_the_staged_copy_offline(tmp_path: Path, model: dict, sft: bool, stage: str, key: str) -> None:
    doc = spec_doc(tmp_path, model)
    doc["spec"]["sft"] = {"enabled": sft}
    run = parse_run(doc)
    command = render_stage(run, stage, context_of(run))
    assert command.overrides[key] == run_paths(run).base_model
    assert command.env["HF_HUB_OFFLINE"] == "1"
    assert any("staged and verified by the prepare stage" in note for note in command.notes)
    assert not [arg for arg in command.argv if model["base"] in arg], "the hub id or s3 URI never reaches verl"
