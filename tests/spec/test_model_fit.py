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

from retool.spec.model_fit import model_fit_findings, model_shape, read_model_config, rollout_memory, training_memory
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
MEMORY = "does not fit one device"
QWEN_72B = {"hidden_size": 8192, "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8, "intermediate_size": 29568,
            "vocab_size": 152064, "tie_word_embeddings": False, "max_position_embeddings": 32768, "torch_dtype": "bfloat16"}  # fmt: skip
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
            "qwen32b-h200", {"rl": {"maxPromptLength": 1024, "maxResponseLength": 40000}, "hardware": {"nodes": 4}}, QWEN_32B,
            ["error spec.rl.maxResponseLength: maxPromptLength + maxResponseLength = 1024 + 40000 = 41024 tokens exceeds the model's context window of 32768 "
             "(max_position_embeddings in config.json): vLLM refuses max_model_len 41024; lower them to a sum of at most 32768"],
            id="prompt plus response above the context window is refused as vLLM refuses it",
        ),
        pytest.param(
            "qwen32b-h200", {"rl": {"maxPromptLength": 1024, "maxResponseLength": 40000}, "hardware": {"nodes": 4}}, {**QWEN_32B, **YARN}, [],
            id="YaRN scaling x4 extends the window to 131072 (41k-token micro-batches of 32B need four nodes)",
        ),
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
    """Context, heads and vocabulary; memory has its own tables below (a 41k-token sequence of 32B is a memory question too)."""
    assert [m for m in messages(model_fit_findings(spec_of(example, **sections), config)) if MEMORY not in m] == expected


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
    (finding,) = [f for f in model_fit_findings(spec, QWEN_32B) if f.path == "spec.rl.tensorParallel"]
    assert finding.severity == "error"
    assert finding.message.startswith(
        "the rollout engine does not fit one device: 79.6 GiB (NVIDIA-H100-80GB-HBM3) x gpuMemoryUtilization 0.5 = 39.8 GiB, "
        "minus the weights 32.8B parameters x 2 bytes / tensorParallel 1 = 61.0 GiB, vLLM's profiling activations 3.2 GiB and its memory outside PyTorch 0.5 GiB, "
        "leaves -24.9 GiB of KV cache"
    ), finding.message
    # the example's own shape on H200: tensorParallel 4 leaves room for many sequences
    fits = rollout_memory(spec_of("qwen32b-h200"), model_shape(QWEN_32B))
    assert fits is not None and fits["kv_cache_gib"] > 10 * fits["sequence_kv_gib"]


# Every example with a known device, with the model it names, and the public recipes' shapes: no false refusal.
ACCEPTED = [
    pytest.param("qwen32b-h200", {}, QWEN_32B, id="the 32B example on 8 H200 (verl recipe/retool run_qwen2-32b: the paper's setting)"),
    pytest.param("qwen32b-h200-text-only", {}, QWEN_32B, id="the 32B text-only example on 8 H200"),
    pytest.param("qwen32b-kueue", {}, QWEN_32B, id="the 32B Kueue example on 2x8 H200"),
    pytest.param("qwen32b-volcano", {}, QWEN_32B, id="the 32B Volcano example on 2x8 H200"),
    pytest.param("qwen7b-ascend", {}, QWEN_7B, id="the 7B Ascend example on 8 910 (the Ascend ReTool best practice)"),
    pytest.param("qwen32b-h200", {"hardware": {"product": "NVIDIA-H100-80GB-HBM3", "nodes": 2}}, QWEN_32B, id="32B on 2x8 H100 with offload"),
    pytest.param(
        "qwen32b-h200", {"model": {"base": "Qwen/Qwen2.5-7B-Instruct"}, "hardware": {"product": "NVIDIA-H100-80GB-HBM3"}, "rl": {"tensorParallel": 2, "sequenceParallel": 4}},
        QWEN_7B, id="7B on 8 H100",
    ),
    pytest.param(
        "qwen32b-h200", {"model": {"base": "Qwen/Qwen2.5-72B-Instruct"}, "hardware": {"nodes": 2}, "rl": {"tensorParallel": 8}}, QWEN_72B, id="72B on 2x8 H200 with offload"
    ),
    pytest.param(
        "qwen32b-h200", {"rl": {"useKlLoss": True, "klLossCoef": 0.001}}, QWEN_32B, id="32B on 8 H200 with a KL loss (the reference model is offloaded by the profile)"
    ),
]  # fmt: skip


@pytest.mark.parametrize(("example", "sections", "config"), ACCEPTED)
def test_runs_that_fit_are_not_refused_for_memory(example: str, sections: dict[str, Any], config: dict[str, Any]) -> None:
    spec = spec_of(example, **sections)
    assert [m for m in messages(model_fit_findings(spec, config)) if MEMORY in m] == []
    plan = training_memory(spec, model_shape(config))
    assert plan is not None and all(phase.fits for phase in plan.phases)


H100 = "NVIDIA-H100-80GB-HBM3"
REFUSED = [
    pytest.param(
        "qwen32b-h200", {"model": {"base": "Qwen/Qwen2.5-72B-Instruct"}, "hardware": {"product": "NVIDIA-A100-SXM4-80GB"}, "rl": {"tensorParallel": 8, "offload": False}}, QWEN_72B,
        {"spec.rl.offload", "spec.hardware.nodes", "spec.rl.maxResponseLength"}, "16 B x 72.7B params / 8 devices = 135.4 GiB",
        id="72B on 8x80 GB with offload off: the actor alone is 135 GiB a device",
    ),
    pytest.param(
        "qwen32b-h200", {"model": {"base": "Qwen/Qwen2.5-72B-Instruct"}, "hardware": {"product": "NVIDIA-A100-SXM4-80GB"}, "rl": {"tensorParallel": 8}}, QWEN_72B,
        {"spec.hardware.nodes"}, "16 B x 72.7B params / 8 devices = 135.4 GiB",
        id="72B on 8x80 GB with offload on: the update loads it all back",
    ),
    pytest.param(
        "qwen32b-h200", {"hardware": {"product": H100}, "rl": {"offload": False}}, QWEN_32B,
        {"spec.rl.offload", "spec.hardware.nodes", "spec.rl.maxResponseLength"}, "vLLM gpuMemoryUtilization 0.9 x 79.6 GiB = 71.6 GiB + vLLM CUDA graphs",
        id="32B at gpuMemoryUtilization 0.9 with offload off on 8 H100",
    ),
    pytest.param(
        "qwen32b-h200", {"hardware": {"product": H100}}, QWEN_32B,
        {"spec.hardware.nodes", "spec.rl.maxResponseLength"}, "checkpointed layer inputs 64 layers x 18432 tokens x 5120 x 2 B",
        id="32B on one node of H100 even with offload: the update is over, and so are the log-probs' 73728 tokens x 6 B of logits",
    ),
    pytest.param(
        "smoke-qwen0.5b", {"hardware": {"product": "NVIDIA-L4"}, "rl": {"maxResponseLength": 20000, "useKlLoss": True}}, QWEN_0_5B,
        {"spec.hardware.nodes", "spec.rl.maxResponseLength"}, "reference model (bf16, KL on)",
        id="0.5B on one L4 with 21k-token sequences and KL: the update and the log-probabilities hold the reference model too",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("example", "sections", "config", "paths", "arithmetic"), REFUSED)
def test_impossible_shapes_are_refused_with_the_arithmetic(example: str, sections: dict[str, Any], config: dict[str, Any], paths: set[str], arithmetic: str) -> None:
    findings = [f for f in model_fit_findings(spec_of(example, **sections), config) if MEMORY in f.message]
    assert {f.path for f in findings} == paths
    assert all(f.severity == "error" for f in findings)
    assert any(arithmetic in f.message for f in findings), [f.message for f in findings]
    for finding in findings:  # each refusal shows its sum against the device
        assert "GiB of " in finding.message or "KV cache" in finding.message


def test_the_reference_model_counts_only_when_kl_is_on_and_the_profile_keeps_it() -> None:
    base = {"hardware": {"product": "NVIDIA-L4"}}
    off = training_memory(spec_of("smoke-qwen0.5b", **base), model_shape(QWEN_0_5B))
    on = training_memory(spec_of("smoke-qwen0.5b", rl={"useKlLoss": True}, **base), model_shape(QWEN_0_5B))
    assert off is not None and on is not None
    ref = 2 * model_shape(QWEN_0_5B).parameters / 1 / 2**30
    assert on.update.total_gib - off.update.total_gib == pytest.approx(ref)  # the small profile keeps the reference model on the device
    assert on.rollout.total_gib - off.rollout.total_gib == pytest.approx(ref)
    big_off = training_memory(spec_of("qwen32b-h200"), model_shape(QWEN_32B))
    big_on = training_memory(spec_of("qwen32b-h200", rl={"useKlLoss": True}), model_shape(QWEN_32B))
    assert big_on.update.total_gib == pytest.approx(big_off.update.total_gib)  # the large profile offloads it between its passes
    assert big_on.log_prob.total_gib > big_off.log_prob.total_gib


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


def test_the_docs_table_of_what_fits_where_is_what_the_code_computes() -> None:
    from retool.spec.memory_fit import fit_table

    doc = (REPO / "docs" / "recipe.md").read_text(encoding="utf-8")
    assert fit_table() in doc, "docs/recipe.md's training memory table is stale: paste `python -m retool.spec.memory_fit`"


def test_the_activation_terms_cover_what_one_h100_measured() -> None:
    """memory_fit's update and log-prob terms against bench/data/gpu_training_memory_h100.json (issue 29).

    The constants came from that run; this keeps them from drifting below it (a run we would accept
    and that would not fit) or far above it (a run we would refuse and that fits).
    """
    import importlib.util

    from retool.spec import memory_fit as mf

    loader = importlib.util.spec_from_file_location("gpu_training_memory", REPO / "bench" / "gpu_training_memory.py")
    assert loader is not None and loader.loader is not None
    bench = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(bench)
    data = json.loads((REPO / "bench" / "data" / "gpu_training_memory_h100.json").read_text())
    checked = 0
    for case in data["cases"]:
        s = case["shape"]
        shape = mf.Shape(
            case["parameters"], case["layers"], s["hidden_size"], s["intermediate_size"], s["vocab_size"], s["num_key_value_heads"], s["hidden_size"] // s["num_attention_heads"], 2
        )
        assert abs(case["static_bytes"] / (mf.ACTOR_BYTES_PER_PARAM * case["parameters"]) - 1) < 0.01
        for t, row in case["phases"].items():
            update = max(row["update"]["peak_above_base"], bench._step_above_static(case)) / mf.GIB
            log_prob = row["log_prob_entropy"]["peak_above_base"] / mf.GIB
            estimated_update = sum(term.gib for term in mf.update_activation_terms(int(t), shape, case["parameters"]))
            estimated_log_prob = sum(term.gib for term in mf.log_prob_activation_terms(int(t), shape, mf.LOGIT_BYTES_FORWARD))
            assert 0.99 <= estimated_update / update <= 1.1, (case["name"], case["layers"], t, estimated_update, update)
            assert 0.99 <= estimated_log_prob / log_prob <= 1.1, (case["name"], case["layers"], t, estimated_log_prob, log_prob)
            checked += 1
    assert checked >= 20


# vLLM's KV cache need for one sequence, by hand from vLLM 0.11.0's source (the 0.6 line's engine, the
# vllm==0.11.0 wheel on PyPI), not from our code:
# - vllm/v1/kv_cache_interface.py, AttentionSpec.page_size_bytes: 2 (K and V) x block_size x num_kv_heads
#   x head_size x get_dtype_size(dtype), one layer's page of block_size tokens;
# - same file, FullAttentionSpec.max_memory_usage_bytes: cdiv(max_model_len, block_size) x page_size_bytes;
# - vllm/v1/core/kv_cache_utils.py, max_memory_usage_bytes sums it over the layers, and
#   check_enough_kv_cache_memory raises ValueError ("To serve at least one request with the models's max
#   seq len ...") when it is over the memory left for the KV cache;
# - vllm/config/model.py, ModelConfig.get_num_kv_heads: max(1, num_key_value_heads // tensor_parallel_size);
#   get_head_size: config.head_dim, else hidden_size // num_attention_heads.
VLLM_BLOCK_SIZE = 16
"""Any block size that divides max_model_len gives the same figure; 18432 tokens are a multiple of 16 to 2048."""


def vllm_kv_bytes_of_one_sequence(config: dict[str, Any], tensor_parallel: int, max_model_len: int) -> int:
    num_kv_heads = max(1, config["num_key_value_heads"] // tensor_parallel)
    head_size = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    dtype_size = {"bfloat16": 2, "float16": 2, "float32": 4}[config["torch_dtype"]]
    page_size_bytes = 2 * VLLM_BLOCK_SIZE * num_kv_heads * head_size * dtype_size
    blocks = -(-max_model_len // VLLM_BLOCK_SIZE)
    return config["num_hidden_layers"] * blocks * page_size_bytes


@pytest.mark.parametrize("tensor_parallel", [4, 1])
def test_one_sequences_kv_cache_is_what_vllm_allocates_for_it_k_and_v(tensor_parallel: int) -> None:
    """The 32B example (2048 + 16384 tokens): 64 layers x 1152 blocks x 2 x 16 x (8 / TP) heads x 128 x 2 B, keys and values."""
    spec = spec_of("qwen32b-h200", rl={"tensorParallel": tensor_parallel, "sequenceParallel": 8})
    tokens = spec.rl.max_prompt_length + spec.rl.max_response_length
    assert tokens == 18432
    expected = vllm_kv_bytes_of_one_sequence(QWEN_32B, tensor_parallel, tokens)
    assert expected == {4: 1_207_959_552, 1: 4_831_838_208}[tensor_parallel]  # 1.125 GiB and 4.5 GiB
    memory = rollout_memory(spec, model_shape(QWEN_32B))
    assert memory is not None and memory["sequence_kv_gib"] * 2**30 == pytest.approx(expected)


def test_a_run_whose_kv_cache_holds_half_a_sequence_is_refused_as_vllm_refuses_it() -> None:
    """32B on one H200 at tensorParallel 1 and gpuMemoryUtilization 0.485: the KV cache left holds the keys
    of one 18432-token sequence but not its values. vLLM refuses to start; counting only one of K and V
    (half of vLLM's figure) would accept the run."""
    spec = spec_of("qwen32b-h200", rl={"tensorParallel": 1, "sequenceParallel": 8, "gpuMemoryUtilization": 0.485})
    need = vllm_kv_bytes_of_one_sequence(QWEN_32B, 1, 18432) / 2**30
    memory = rollout_memory(spec, model_shape(QWEN_32B))
    assert memory is not None and need / 2 < memory["kv_cache_gib"] < need, (memory["kv_cache_gib"], need)
    (finding,) = [f for f in model_fit_findings(spec, QWEN_32B) if f.path == "spec.rl.tensorParallel"]
    assert finding.severity == "error" and "vLLM refuses to start" in finding.message
    assert f"less than the {need:.2f} GiB one sequence of 18432 tokens needs" in finding.message, finding.message


OFFLOAD_ADVICE = "rl.offload: true"


@pytest.mark.parametrize(
    ("sections", "config", "path"),
    [
        pytest.param({"hardware": {"product": H100}}, QWEN_32B, "spec.rl.maxResponseLength", id="log-probabilities over one H100"),
        pytest.param({"rl": {"gpuMemoryUtilization": 0.995}}, QWEN_32B, "spec.rl.gpuMemoryUtilization", id="rollout over one H200 (vLLM's share and its CUDA graphs)"),
    ],
)  # fmt: skip
def test_a_refusal_never_advises_turning_on_offload_when_it_is_on(sections: dict[str, Any], config: dict[str, Any], path: str) -> None:
    """The same refusal with offload off advises it (the advice is real), with offload on it does not (it would change nothing)."""
    on = spec_of("qwen32b-h200", **sections)
    assert on.rl.offload is True
    found = model_fit_findings(on, config)
    assert path in {f.path for f in found}, messages(found)
    assert "spec.rl.offload" not in {f.path for f in found}
    assert not [f for f in found if OFFLOAD_ADVICE in f.message], messages(found)
    off = model_fit_findings(spec_of("qwen32b-h200", **{**sections, "rl": {**sections.get("rl", {}), "offload": False}}), config)
    assert [f for f in off if OFFLOAD_ADVICE in f.message], messages(off)
