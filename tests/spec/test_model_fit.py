"""The run against the model's config.json: context window, heads vs parallelism, vocabulary, memory per device.

Configs are the published shapes of Qwen2.5 0.5B/7B/32B-Instruct (their config.json values), written
as small files by the tests; specs are the repository's examples with the fields under test changed.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from retool.spec.model_fit import model_fit_findings, model_shape, read_model_config, rollout_memory
from retool.spec.validate import parse_run
from tests.conftest import REPO, repo_env

QWEN_0_5B = {"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2, "intermediate_size": 4864,
             "vocab_size": 151936, "tie_word_embeddings": True, "max_position_embeddings": 32768, "torch_dtype": "bfloat16"}  # fmt: skip
QWEN_7B = {"hidden_size": 3584, "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4, "intermediate_size": 18944,
           "vocab_size": 152064, "tie_word_embeddings": False, "max_position_embeddings": 32768, "torch_dtype": "bfloat16"}  # fmt: skip
QWEN_32B = {"hidden_size": 5120, "num_hidden_layers": 64, "num_attention_heads": 40, "num_key_value_heads": 8, "intermediate_size": 27648,
            "vocab_size": 152064, "tie_word_embeddings": False, "max_position_embeddings": 32768, "torch_dtype": "bfloat16"}  # fmt: skip
ULYSSES = "verl's Ulysses sequence parallelism needs the head count to be a multiple of it"
VLLM_TP = "vLLM's tensor parallelism needs the head count to be a multiple of it"
YARN = {"rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}


def spec_of(example: str, **sections: dict[str, Any]) -> Any:
    doc = yaml.safe_load((REPO / "examples" / f"retoolrun-{example}.yaml").read_text())
    for key, value in sections.items():
        doc["spec"][key] = {**doc["spec"].get(key, {}), **value}
    return parse_run(copy.deepcopy(doc)).spec


def messages(findings: list) -> list[str]:
    return [f"{f.severity} {f}" for f in findings]


@pytest.mark.parametrize(
    ("example", "sections", "config", "expected"),
    [
        pytest.param("qwen32b-h200", {}, QWEN_32B, [], id="the 32B example fits Qwen2.5-32B on H200"),
        pytest.param("qwen7b-ascend", {}, QWEN_7B, [], id="the 7B Ascend example fits Qwen2.5-7B"),
        pytest.param(
            "qwen32b-h200", {"rl": {"maxPromptLength": 1024, "maxResponseLength": 40000}}, QWEN_32B,
            ["error spec.rl.maxResponseLength: maxPromptLength + maxResponseLength = 1024 + 40000 = 41024 tokens exceeds the model's context window of 32768 "
             "(max_position_embeddings in config.json): vLLM refuses max_model_len 41024; lower them to a sum of at most 32768"],
            id="prompt plus response above the context window is refused as vLLM refuses it",
        ),
        pytest.param("qwen32b-h200", {"rl": {"maxPromptLength": 1024, "maxResponseLength": 40000}}, {**QWEN_32B, **YARN}, [], id="YaRN scaling x4 extends the window to 131072"),
        pytest.param(
            "qwen7b-ascend", {"rl": {"tensorParallel": 8, "sequenceParallel": 4}}, QWEN_7B,
            ["error spec.rl.tensorParallel: 8 does not split the model's 28 attention heads (config.json): vLLM's tensor parallelism needs the head count to be a multiple of it"],
            id="7B with 28 heads and tensorParallel 8",
        ),
        pytest.param(
            "smoke-qwen0.5b", {"hardware": {"devicesPerNode": 4}, "rl": {"tensorParallel": 4, "sequenceParallel": 1}, "sft": {"sequenceParallel": 1}}, QWEN_0_5B,
            ["error spec.rl.tensorParallel: 4 does not split the model's 14 attention heads (config.json): vLLM's tensor parallelism needs the head count to be a multiple of it"],
            id="0.5B with 14 heads and tensorParallel 4",
        ),
        pytest.param(
            "smoke-qwen0.5b", {"hardware": {"devicesPerNode": 4}, "rl": {"tensorParallel": 1, "sequenceParallel": 4}, "sft": {"sequenceParallel": 4}}, QWEN_0_5B,
            [f"error spec.rl.sequenceParallel: 4 does not split the model's 14 attention heads (config.json): {ULYSSES}",
             f"error spec.sft.sequenceParallel: 4 does not split the model's 14 attention heads (config.json): {ULYSSES}"],
            id="0.5B with Ulysses sequence parallel 4 in rl and sft",
        ),
        pytest.param(
            "qwen32b-h200", {"sft": {"maxLength": 40000}}, QWEN_32B,
            ["warning spec.sft.maxLength: 40000 tokens is longer than the model's context window of 32768 (max_position_embeddings): positions beyond it were never trained"],
            id="SFT longer than the window is a warning",
        ),
    ],
)  # fmt: skip
def test_model_fit(example: str, sections: dict[str, Any], config: dict[str, Any], expected: list[str]) -> None:
    assert messages(model_fit_findings(spec_of(example, **sections), config)) == expected


def test_kv_heads_fewer_than_tensor_parallel_are_replicated_when_they_divide_it() -> None:
    spec = spec_of("qwen7b-ascend", rl={"tensorParallel": 4, "sequenceParallel": 4})
    assert model_fit_findings(spec, {**QWEN_7B, "num_attention_heads": 28, "num_key_value_heads": 2}) == []
    found = messages(model_fit_findings(spec, {**QWEN_7B, "num_attention_heads": 24, "num_key_value_heads": 3}))
    assert found == [
        f"error spec.rl.tensorParallel: 4 does not split the model's 3 key/value heads (config.json): {VLLM_TP} or a divisor of it",
        f"error spec.rl.sequenceParallel: 4 does not split the model's 3 key/value heads (config.json): {ULYSSES} or a divisor of it",
        f"error spec.sft.sequenceParallel: 4 does not split the model's 3 key/value heads (config.json): {ULYSSES} or a divisor of it",
    ]


def test_a_tokenizer_larger_than_the_embedding_is_refused() -> None:
    spec = spec_of("qwen7b-ascend")
    assert model_fit_findings(spec, QWEN_7B, tokenizer_size=151665) == []
    assert messages(model_fit_findings(spec, QWEN_7B, tokenizer_size=152100)) == [
        "error spec.model.base: the tokenizer has 152100 tokens but the model's embedding has 152064 rows (config.json vocab_size): "
        "ids above it cannot be looked up; use the tokenizer that belongs to the model"
    ]


def test_parameters_are_estimated_from_the_shape() -> None:
    """Qwen2.5's published sizes: 0.49B, 7.6B, 32.5B (biases aside)."""
    assert round(model_shape(QWEN_0_5B).parameters / 1e9, 2) == 0.49
    assert round(model_shape(QWEN_7B).parameters / 1e9, 1) == 7.6
    assert round(model_shape(QWEN_32B).parameters / 1e9, 1) == 32.8


def test_a_rollout_engine_that_leaves_no_kv_cache_for_one_sequence_fails_with_the_arithmetic() -> None:
    spec = spec_of("qwen32b-h200", hardware={"product": "NVIDIA-H100-80GB-HBM3"}, rl={"tensorParallel": 1, "sequenceParallel": 8, "gpuMemoryUtilization": 0.5})
    memory = rollout_memory(spec, model_shape(QWEN_32B))
    assert memory is not None and memory["weights_gib"] > memory["budget_gib"]
    (finding,) = model_fit_findings(spec, QWEN_32B)
    assert finding.path == "spec.rl.tensorParallel" and finding.severity == "error"
    assert finding.message.startswith(
        "the rollout engine does not fit one device: 79.6 GiB (NVIDIA-H100-80GB-HBM3) x gpuMemoryUtilization 0.5 = 39.8 GiB, "
        "minus the weights 32.8B parameters x 2 bytes / tensorParallel 1 = 61.0 GiB, leaves -21.2 GiB of KV cache"
    ), finding.message
    # the example's own shape on H200: tensorParallel 4 leaves room for many sequences
    fits = rollout_memory(spec_of("qwen32b-h200"), model_shape(QWEN_32B))
    assert fits is not None and fits["kv_cache_gib"] > 10 * fits["sequence_kv_gib"]


def test_no_memory_verdict_without_a_known_device() -> None:
    spec = spec_of("qwen32b-h200", hardware={"product": "NVIDIA-Some-Future-GPU"}, rl={"tensorParallel": 1, "sequenceParallel": 8, "gpuMemoryUtilization": 0.1})
    assert rollout_memory(spec, model_shape(QWEN_32B)) is None


def test_read_model_config_names_what_is_wrong(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(QWEN_7B))
    assert read_model_config(tmp_path) == QWEN_7B
    with pytest.raises(ValueError, match="missing does not exist: give a model directory"):
        read_model_config(tmp_path / "missing")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match=r"bad\.json is not JSON"):
        read_model_config(tmp_path / "bad.json")


def validate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "retool.cli", "validate", *args], env=repo_env(), capture_output=True, text=True, timeout=120, check=False)


def test_retool_validate_checks_the_run_against_a_model_config(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(QWEN_7B))
    example = str(REPO / "examples" / "retoolrun-qwen7b-ascend.yaml")
    assert validate(example, "--model-config", str(config)).returncode == 0
    doc = yaml.safe_load(Path(example).read_text())
    doc["spec"]["rl"]["tensorParallel"] = 8
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(doc))
    result = validate(str(tmp_path / "run.yaml"), "--model-config", str(tmp_path))
    assert result.returncode == 1
    assert result.stdout == f"{tmp_path / 'run.yaml'}#0: spec.rl.tensorParallel: 8 does not split the model's 28 attention heads (config.json): {VLLM_TP}\n"
    missing = validate(example, "--model-config", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "--model-config:" in missing.stderr and "nope does not exist" in missing.stderr


def test_retool_validate_reads_the_config_of_a_local_base_model(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(QWEN_7B))
    doc = yaml.safe_load((REPO / "examples" / "retoolrun-qwen7b-ascend.yaml").read_text())
    doc["spec"]["model"]["base"] = str(tmp_path / "model")
    doc["spec"]["rl"]["maxResponseLength"] = 40000
    doc["spec"]["sft"]["maxLength"] = 40000
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(doc))
    result = validate(str(tmp_path / "run.yaml"))
    assert result.returncode == 1 and "spec.rl.maxResponseLength: maxPromptLength + maxResponseLength = 2048 + 40000 = 42048 tokens exceeds" in result.stdout
    assert "spec.sft.maxLength: warning: 40000 tokens is longer than the model's context window" in result.stderr
