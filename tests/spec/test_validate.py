"""The RetoolRun contract: valid examples pass, invalid specs fail naming the field."""

from __future__ import annotations

import copy
import re
import subprocess
import sys

import pytest
import yaml

from retool.spec.model import RetoolRun
from retool.spec.rules import sandbox_replicas
from retool.spec.validate import SpecError, parse_run, validate_document, validate_text
from tests.conftest import EXAMPLES, OPERATOR_OF_EXAMPLE, REPO, repo_env

MINIMAL = {
    "apiVersion": "retool.dev/v1alpha1",
    "kind": "RetoolRun",
    "metadata": {"name": "run"},
    "spec": {"storage": {"pvc": {"claimName": "retool-data"}}},
}


def with_spec(**changes) -> dict:
    """MINIMAL with nested spec changes given as dotted paths (``rl__batchSize=3``)."""
    doc = copy.deepcopy(MINIMAL)
    for dotted, value in changes.items():
        keys = dotted.split("__")
        node = doc["spec"]
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = value
    return doc


def test_every_example_is_valid():
    assert EXAMPLES, "examples/ has no RetoolRun samples"
    for path in EXAMPLES:
        for document in yaml.safe_load_all(path.read_text()):
            assert validate_document(document) == [], path.name


def test_a_spec_that_names_only_a_model_is_valid_and_gets_a_claim_created():
    run = parse_run({**MINIMAL, "spec": {"model": {"base": "Qwen/Qwen2.5-7B-Instruct"}}})
    assert run.spec.storage.pvc.claim_name is None and run.spec.storage.retain == "keep"


def test_minimal_spec_takes_the_32b_h200_recipe_defaults():
    run = parse_run(MINIMAL)
    assert run.spec.model.base == "Qwen/Qwen2.5-32B-Instruct"
    assert (run.spec.rl.batch_size, run.spec.rl.mini_batch_size, run.spec.rl.rollout_n) == (512, 64, 16)
    assert (run.spec.rl.tensor_parallel, run.spec.rl.sequence_parallel, run.spec.rl.offload) == (4, 8, True)
    assert (run.spec.rl.clip_ratio_low, run.spec.rl.clip_ratio_high) == (0.2, 0.28)
    assert (run.spec.sft.epochs, run.spec.sft.batch_size, run.spec.sft.max_length, run.spec.sft.sequence_parallel) == (6, 32, 16384, 4)
    assert (run.spec.eval.samples_per_problem, run.spec.eval.top_p) == (30, 0.6)
    assert sandbox_replicas(run.spec) == 16


def test_examples_hold_the_published_recipes():
    h200 = parse_run(yaml.safe_load((REPO / "examples/retoolrun-qwen32b-h200.yaml").read_text()))
    assert h200.spec.rl.learning_rate == 1e-6 and h200.spec.sft.learning_rate == 1e-5
    assert h200.spec.sandbox.max_concurrent == 256 and sandbox_replicas(h200.spec) == 16
    ascend = parse_run(yaml.safe_load((REPO / "examples/retoolrun-qwen7b-ascend.yaml").read_text()))
    assert ascend.spec.hardware.accelerator == "ascend"
    rl = ascend.spec.rl
    assert (rl.tensor_parallel, rl.sequence_parallel, rl.max_turns, rl.max_response_length) == (2, 4, 16, 20480)
    assert (rl.batch_size, rl.mini_batch_size, rl.rollout_n) == (32, 16, 16)
    assert (ascend.spec.eval.samples_per_problem, ascend.spec.eval.top_p) == (30, 0.6)


INVALID = [
    ("wrong type for an integer", with_spec(rl__batchSize="many"), "spec.rl.batchSize", "valid integer"),
    ("boolean field given a list", with_spec(rl__offload=[1]), "spec.rl.offload", "valid boolean"),
    ("unknown field suggests the right name", with_spec(rl__batchSiz=512), "spec.rl.batchSiz", "did you mean 'batchSize'"),
    ("unknown top-level spec field", with_spec(trainers={}), "spec.trainers", "unknown field"),
    ("verl line unquoted in YAML", with_spec(trainer__verl=0.9), "spec.trainer.verl", 'must be "0.6.1" or "0.9.1" (the line\'s verl version): YAML read 0.9 as a number'),
    ("verl line that does not exist", with_spec(trainer__verl="0.7"), "spec.trainer.verl", "'0.6.1' or '0.9.1'"),
    ("accelerator outside the enum", with_spec(hardware__accelerator="tpu"), "spec.hardware.accelerator", "'nvidia', 'ascend' or 'cpu'"),
    (
        "a CPU rehearsal with a GPU rollout engine",
        with_spec(hardware__accelerator="cpu", trainer={"verl": "0.9.1"}),
        "spec.rl.rolloutEngine",
        "is vllm, which needs a GPU or NPU; hardware.accelerator cpu rehearses with hf",
    ),
    ("the rehearsal engine on GPUs", with_spec(rl__rolloutEngine="hf", trainer={"verl": "0.9.1"}), "spec.rl.rolloutEngine", "hf is the CPU rehearsal engine"),
    (
        "a CPU rehearsal on the 0.6 line",
        with_spec(hardware__accelerator="cpu", rl__rolloutEngine="hf"),
        "spec.trainer.verl",
        'hardware.accelerator cpu runs on the 0.9 line only ("0.9.1"',
    ),
    ("algorithm outside the enum", with_spec(rl__algorithm="dpo"), "spec.rl.algorithm", "'grpo' or 'ppo'"),
    ("batch not divisible by mini-batch", with_spec(rl__batchSize=100, rl__miniBatchSize=64), "spec.rl.batchSize", "divisible by rl.miniBatchSize"),
    (
        "a step's responses not a multiple of the devices, though mini-batches split over the data-parallel ranks",
        with_spec(rl__batchSize=3, rl__miniBatchSize=1, rl__rolloutN=1, rl__sequenceParallel=8),
        "spec.rl.batchSize",
        "batchSize x rolloutN = 3 x 1 = 3 responses per step must be a multiple of the 8 devices",
    ),
    ("sglang, which no trainer image installs", with_spec(rl__rolloutEngine="sglang"), "spec.rl.rolloutEngine", "no ReTool trainer image installs SGLang"),
    ("mini-batch larger than batch", with_spec(rl__batchSize=32, rl__miniBatchSize=64), "spec.rl.miniBatchSize", "larger than rl.batchSize"),
    ("tensor parallel not dividing a node", with_spec(rl__tensorParallel=3), "spec.rl.tensorParallel", "must divide the 8 devices of one node"),
    ("sequence parallel not dividing devices", with_spec(rl__sequenceParallel=16), "spec.rl.sequenceParallel", "must divide the 8 devices"),
    ("sft sequence parallel not dividing devices", with_spec(sft__sequenceParallel=3), "spec.sft.sequenceParallel", "must divide"),
    ("sft batch not splitting over ranks", with_spec(sft__batchSize=31), "spec.sft.batchSize", "data-parallel ranks"),
    ("sft micro batch not dividing per-rank batch", with_spec(sft__microBatchSizePerDevice=5), "spec.sft.microBatchSizePerDevice", "must divide"),
    ("maxConcurrent below one", with_spec(sandbox__maxConcurrent=0), "spec.sandbox.maxConcurrent", "greater than or equal to 1"),
    ("per-replica concurrency above maxConcurrent", with_spec(sandbox__maxConcurrent=8, sandbox__perReplicaConcurrency=16), "spec.sandbox.perReplicaConcurrency", "larger than"),
    ("bad quantity", with_spec(sandbox__resources={"limits": {"memory": "20Gx"}}), "spec.sandbox.resources.limits.memory", "not a Kubernetes quantity"),
    ("memory limit too small for the executions", with_spec(sandbox__resources={"limits": {"memory": "4Gi"}}), "spec.sandbox.resources.limits.memory", "OOM"),
    ("request above limit", with_spec(hardware__resources={"requests": {"cpu": "8"}, "limits": {"cpu": "4"}}), "spec.hardware.resources.requests.cpu", "larger than the limit"),
    (
        "sandbox request above limit",
        with_spec(sandbox__resources={"requests": {"cpu": "8"}, "limits": {"cpu": "4", "memory": "64Gi"}}),
        "spec.sandbox.resources.requests.cpu",
        "larger than the limit",
    ),
    ("malformed s3 uri", with_spec(storage={"pvc": {"claimName": "d"}, "s3": {"uri": "s3:/bucket"}}), "spec.storage.s3.uri", "s3://bucket/prefix"),
    ("malformed model source", with_spec(model__base="not a model"), "spec.model.base", "Hugging Face id"),
    ("malformed tracking uri", with_spec(tracking__mlflow__trackingUri="mlflow:5000"), "spec.tracking.mlflow.trackingUri", "http(s)://"),
    ("claim template beside an existing claim", with_spec(storage={"pvc": {"claimName": "d", "size": "1Ti"}}), "spec.storage.pvc.size", "existing claim"),
    ("retain delete of an existing claim", with_spec(storage={"pvc": {"claimName": "d"}, "retain": "delete"}), "spec.storage.retain", "never deleted"),
    ("retain outside the enum", with_spec(storage={"retain": "forever"}), "spec.storage.retain", "'keep' or 'delete'"),
    ("zero claim size", with_spec(storage={"pvc": {"size": "0"}}), "spec.storage.pvc.size", "larger than zero"),
    ("fractional number as a size", with_spec(storage={"pvc": {"size": 1.5}}), "spec.storage.pvc.size", "fractional number"),
    (
        "ReadWriteOnce claim template on two nodes",
        with_spec(hardware__nodes=2, storage={"pvc": {"accessModes": ["ReadWriteOnce"]}}),
        "spec.storage.pvc.accessModes",
        "needs ReadWriteMany",
    ),
    ("read-only access mode", with_spec(storage={"pvc": {"accessModes": ["ReadOnlyMany"]}}), "spec.storage.pvc.accessModes[0]", "'ReadWriteOnce' or 'ReadWriteMany'"),
    ("queue and gang scheduler together", with_spec(scheduling={"queueName": "q", "gang": {"enabled": True}}), "spec.scheduling.gang.enabled", "not both"),
    ("workload priority without a queue", with_spec(scheduling={"workloadPriorityClassName": "high"}), "spec.scheduling.workloadPriorityClassName", "needs scheduling.queueName"),
    ("gang queue without gang scheduling", with_spec(scheduling={"gang": {"queue": "research"}}), "spec.scheduling.gang.queue", "no effect"),
    ("queue name that is no label value", with_spec(scheduling={"queueName": "team a"}), "spec.scheduling.queueName", "label value"),
    ("text-only with the cold-start SFT", with_spec(recipe="text-only"), "spec.sft.enabled", "teaches code-interpreter calls"),
    ("text-only with tool-turn shaping", with_spec(recipe="text-only", sft__enabled=False, rl__toolTurnShaping=True), "spec.rl.toolTurnShaping", "tool turns"),
    ("recipe outside the enum", with_spec(recipe="text"), "spec.recipe", "'tool-integrated' or 'text-only'"),
    ("pod label the operator owns", with_spec(pods={"labels": {"retool.dev/run": "x"}}), "spec.pods.labels.retool.dev/run", "operator's own labels"),
    ("pod label key that is invalid", with_spec(pods={"labels": {"bad key": "x"}}), "spec.pods.labels.bad key", "label key"),
    ("kueue label set by hand", with_spec(pods={"labels": {"kueue.x-k8s.io/queue-name": "q"}}), "spec.pods.labels.kueue.x-k8s.io/queue-name", "spec.scheduling"),
    (
        "env both value and valueFrom",
        with_spec(pods={"env": [{"name": "A", "value": "1", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}),
        "spec.pods.env[0]",
        "exactly one",
    ),
    ("env with neither", with_spec(pods={"env": [{"name": "A"}]}), "spec.pods.env[0]", "exactly one of value and valueFrom"),
    ("env overriding the stage context", with_spec(pods={"env": [{"name": "RETOOL_ATTEMPT", "value": "9"}]}), "spec.pods.env[0].name", "set by the operator"),
    ("env twice", with_spec(pods={"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}), "spec.pods.env[1].name", "set twice"),
    (
        "env s3 credentials beside storage.s3",
        with_spec(storage={"s3": {"uri": "s3://bucket/p"}}, pods={"env": [{"name": "AWS_ACCESS_KEY_ID", "value": "x"}]}),
        "spec.pods.env[0].name",
        "storage.s3",
    ),
    ("envFrom with both sources", with_spec(pods={"envFrom": [{"secretRef": {"name": "a"}, "configMapRef": {"name": "b"}}]}), "spec.pods.envFrom[0]", "exactly one"),
    ("volume without a source", with_spec(pods={"volumes": [{"name": "v", "mountPath": "/v"}]}), "spec.pods.volumes[0]", "found none"),
    (
        "volume with two sources",
        with_spec(pods={"volumes": [{"name": "v", "mountPath": "/v", "emptyDir": {}, "nfs": {"server": "n", "path": "/e"}}]}),
        "spec.pods.volumes[0]",
        "found emptyDir, nfs",
    ),
    ("unsupported volume type", with_spec(pods={"volumes": [{"name": "v", "mountPath": "/v", "hostPath": {"path": "/"}}]}), "spec.pods.volumes[0].hostPath", "unknown field"),
    ("volume named like the operator's", with_spec(pods={"volumes": [{"name": "data", "mountPath": "/v", "emptyDir": {}}]}), "spec.pods.volumes[0].name", "operator's volumes"),
    ("volume over the run's claim", with_spec(pods={"volumes": [{"name": "v", "mountPath": "/data/cache", "emptyDir": {}}]}), "spec.pods.volumes[0].mountPath", "run's claim"),
    ("volume over the spec", with_spec(pods={"volumes": [{"name": "v", "mountPath": "/etc", "emptyDir": {}}]}), "spec.pods.volumes[0].mountPath", "run's spec"),
    ("volume name not a DNS label", with_spec(pods={"volumes": [{"name": "V_1", "mountPath": "/v", "emptyDir": {}}]}), "spec.pods.volumes[0].name", "DNS label"),
    ("pull secret not an object name", with_spec(pods={"imagePullSecrets": ["Reg Cred"]}), "spec.pods.imagePullSecrets[0]", "Kubernetes object name"),
    ("max rows zero", with_spec(data__maxRows=0), "spec.data.maxRows", "greater than or equal to 1"),
    ("every stage disabled", with_spec(sft__enabled=False, rl__enabled=False, eval__enabled=False), "spec", "would do nothing"),
    ("reward alarm rate above 1", with_spec(rl__rewardWatch={"benignRate": 0.9, "shift": 0.15}), "spec.rl.rewardWatch.shift", "benignRate + shift must be below 1"),
    ("clip high below clip low", with_spec(rl__clipRatioHigh=0.1), "spec.rl.clipRatioHigh", "below rl.clipRatioLow"),
    ("duplicate eval set names", with_spec(data__eval=[{"name": "a", "source": "o/a"}, {"name": "a", "source": "o/b"}]), "spec.data.eval[1].name", "unique"),
    ("negative learning rate", with_spec(rl__learningRate=-1), "spec.rl.learningRate", "greater than 0"),
    ("missing spec", {k: v for k, v in MINIMAL.items() if k != "spec"}, "spec", "required field is missing"),
    ("wrong apiVersion", {**MINIMAL, "apiVersion": "retool.dev/v1"}, "apiVersion", "retool.dev/v1alpha1"),
    ("too-long run name", {**MINIMAL, "metadata": {"name": "r" * 40}}, "metadata.name", "at most 39"),
    ("run name not a DNS-1035 label", {**MINIMAL, "metadata": {"name": "1run"}}, "metadata.name", "DNS-1035"),
]


@pytest.mark.parametrize(("document", "path", "fragment"), [case[1:] for case in INVALID], ids=[case[0] for case in INVALID])
def test_invalid_spec_is_rejected_naming_the_field(document, path, fragment):
    problems = validate_document(document)
    assert any(p.path == path and fragment in p.message for p in problems), problems
    with pytest.raises(SpecError, match=re.escape(path)):
        parse_run(document)


def test_name_problems_are_reported_alongside_field_errors():
    document = {**with_spec(rl__batchSize="x"), "metadata": {"name": "Bad"}}
    paths = {p.path for p in validate_document(document)}
    assert paths == {"spec.rl.batchSize", "metadata.name"}


def test_multi_document_stream_reports_each_document():
    text = yaml.safe_dump_all([MINIMAL, with_spec(rl__tensorParallel=3), MINIMAL])
    count, problems = validate_text(text, "runs.yaml")
    assert count == 3
    assert [(p.document, p.problem.path) for p in problems] == [(1, "spec.rl.tensorParallel")]


def test_broken_yaml_is_a_problem_not_a_crash():
    count, problems = validate_text("spec: [unclosed", "x.yaml")
    assert count == 0 and problems[0].problem.path == "(yaml)"


def test_spec_round_trips_through_camel_case():
    run = parse_run(with_spec(rl__miniBatchSize=32, sandbox__memoryLimitMB=512))
    dumped = run.model_dump(exclude_none=True)
    assert dumped["spec"]["rl"]["miniBatchSize"] == 32
    assert dumped["spec"]["sandbox"]["memoryLimitMB"] == 512
    assert RetoolRun.model_validate(dumped) == run


def run_cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "retool.cli", *args], input=stdin, capture_output=True, text=True, env=repo_env(), cwd=REPO)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_cli_validate_passes_on_the_examples_for_the_operator_each_is_written_for(example):
    result = run_cli("validate", *OPERATOR_OF_EXAMPLE.get(example.stem, ()), str(example))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all valid" in result.stderr


def test_cli_validate_prints_one_line_per_problem_and_exits_1(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(with_spec(rl__batchSize=100, hardware__accelerator="tpu")))
    result = run_cli("validate", str(bad))
    assert result.returncode == 1
    lines = result.stdout.strip().splitlines()
    assert f"{bad}#0: spec.hardware.accelerator: Input should be 'nvidia', 'ascend' or 'cpu'" in lines
    assert len(lines) == 1  # structural errors stop the cross-field rules (they would misfire)


def test_cli_validate_reads_stdin_and_speaks_json():
    result = run_cli("validate", "--format", "json", "-", stdin=yaml.safe_dump(with_spec(rl__tensorParallel=3)))
    assert result.returncode == 1
    assert '"path": "spec.rl.tensorParallel"' in result.stdout


def test_cli_validate_reports_a_missing_file():
    result = run_cli("validate", "/nonexistent/run.yaml")
    assert result.returncode == 1 and "(file)" in result.stdout
