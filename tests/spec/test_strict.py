"""`retool validate` says what the API server says: the same documents are refused by the strict
pydantic model and by the generated CRD schema (what the API server enforces, with kubectl's
default strict field validation refusing unknown fields), at the same field paths, all in one report.

Why pydantic strict mode rather than validating against the CRD schema: the model is the single
source of both (the CRD is generated from it), the operator and the webhook parse with the same
model, and pydantic reports every error with its path at once; this table holds the two to the
same verdicts. The YAML side matters too: documents are read as kubectl reads them (``1e-5`` is a
number there, a string in PyYAML's YAML 1.1).
"""

from __future__ import annotations

import copy
import re
from typing import Any

import jsonschema
import pytest
import yaml

from retool.spec.validate import load_documents, validate_document, validate_text
from tests.conftest import REPO

CRD = yaml.safe_load((REPO / "charts/retool/crds/retoolruns.retool.dev.yaml").read_text())
SCHEMA = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
HEAD = "apiVersion: retool.dev/v1alpha1\nkind: RetoolRun\nmetadata:\n  name: run\nspec:\n"


def strict(schema: Any) -> Any:
    """The CRD schema as the API server applies it with strict field validation: unknown fields refused."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if out.get("type") == "object" and "properties" in out and "additionalProperties" not in out:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


VALIDATOR = jsonschema.Draft4Validator(strict(copy.deepcopy(SCHEMA)))  # OpenAPI v3.0: boolean exclusiveMinimum, as draft 4


def crd_paths(document: dict[str, Any]) -> set[str]:
    """Field paths the CRD schema refuses, in `retool validate`'s notation."""
    out = set()
    for error in VALIDATOR.iter_errors(document):
        parts = [str(p) if isinstance(p, str) else f"[{p}]" for p in error.absolute_path]
        path = ".".join(parts).replace(".[", "[")
        if error.validator == "additionalProperties":
            for name in re.findall(r"'([^']+)'", error.message.split("(")[-1]):
                out.add(f"{path}.{name}" if path else name)
        elif error.validator == "anyOf" and error.schema.get("x-kubernetes-int-or-string"):
            out.add(path)
        else:
            out.add(path)
    return out


def pydantic_paths(document: dict[str, Any]) -> set[str]:
    return {p.path for p in validate_document(document)}


CASES: list[tuple[str, str, set[str]]] = [
    ("a spec that names only a model", "  model:\n    base: Qwen/Qwen2.5-7B-Instruct\n", set()),
    ("an integer written as a string is refused", "  rl:\n    batchSize: \"512\"\n", {"spec.rl.batchSize"}),
    ("a boolean written as a string is refused", "  rl:\n    offload: \"true\"\n", {"spec.rl.offload"}),
    ("a boolean written as a number is refused", "  rl:\n    offload: 1\n", {"spec.rl.offload"}),
    ("an integer field given a fraction is refused", "  rl:\n    steps: 2.5\n", {"spec.rl.steps"}),
    ("a number field given an integer is fine", "  rl:\n    temperature: 2\n", set()),
    ("a learning rate in e-notation is a number, as for kubectl", "  rl:\n    learningRate: 1e-5\n", set()),
    ("e-notation without a sign is a number too", "  sft:\n    learningRate: 1.0e5\n", {"spec.sft.learningRate"}),  # a number, above the bound
    ("a number given as a string is refused", "  rl:\n    learningRate: \"1e-6\"\n", {"spec.rl.learningRate"}),
    ("a quantity may be a string", "  hardware:\n    sharedMemory: 64Gi\n", set()),
    ("a quantity may be an integer", "  hardware:\n    sharedMemory: 68719476736\n", set()),
    ("a quantity may not be a fraction", "  hardware:\n    sharedMemory: 1.5\n", {"spec.hardware.sharedMemory"}),
    ("an unknown field is refused", "  rl:\n    batchSiz: 512\n", {"spec.rl.batchSiz"}),
    ("an unknown section is refused", "  trainers: {}\n", {"spec.trainers"}),
    ("a verl line is a quoted string, never a number", "  trainer:\n    verl: 0.9\n", {"spec.trainer.verl"}),
    ("an enum is closed", "  hardware:\n    accelerator: tpu\n", {"spec.hardware.accelerator"}),
    ("a bound holds", "  rl:\n    topP: 1.5\n", {"spec.rl.topP"}),
    ("an exclusive bound holds", "  rl:\n    learningRate: 0\n", {"spec.rl.learningRate"}),
    ("a pattern holds", "  model:\n    base: not a model\n", {"spec.model.base"}),
    ("list items are checked where they are", "  data:\n    eval:\n      - {name: aime_2024, source: Maxwell-Jia/AIME_2024, weight: 2}\n", {"spec.data.eval[0].weight"}),
    (
        "every error of a document is in one report",
        "  rl:\n    batchSize: \"512\"\n    offload: \"yes please\"\n  hardware:\n    nodes: 0\n    gpus: 8\n  storage:\n    retain: forever\n",
        {"spec.rl.batchSize", "spec.rl.offload", "spec.hardware.nodes", "spec.hardware.gpus", "spec.storage.retain"},
    ),
    ("pod volumes are typed: an unsupported type is refused", "  pods:\n    volumes:\n      - {name: v, mountPath: /v, hostPath: {path: /}}\n", {"spec.pods.volumes[0].hostPath"}),
    ("a claim size is a quantity", "  storage:\n    pvc:\n      size: lots\n", {"spec.storage.pvc.size"}),
]


@pytest.mark.parametrize(("body", "paths"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_validate_and_the_crd_schema_agree(body: str, paths: set[str]) -> None:
    (document,) = load_documents(HEAD + body)
    assert pydantic_paths(document) == paths, "retool validate"
    assert crd_paths(document) == paths, "the CRD schema (the API server)"


def test_the_whole_report_comes_from_one_call() -> None:
    count, problems = validate_text(HEAD + CASES[-3][1], "run.yaml")
    assert count == 1 and {p.problem.path for p in problems} == CASES[-3][2]
    messages = {p.problem.path: p.problem.message for p in problems}
    assert messages["spec.rl.batchSize"] == "Input should be a valid integer, got a string '512'"
    assert "did you mean" not in messages["spec.hardware.gpus"] and "allowed: accelerator" in messages["spec.hardware.gpus"]


def test_the_table_covers_a_refusal_by_each_kind_of_rule() -> None:
    """Type, unknown field, enum, bound, pattern and int-or-string: each has a case above."""
    kinds = set()
    for _, body, paths in CASES:
        if not paths:
            continue
        (document,) = load_documents(HEAD + body)
        kinds |= {error.validator for error in VALIDATOR.iter_errors(document)}
    assert {"type", "additionalProperties", "enum", "maximum", "minimum", "pattern", "anyOf"} <= kinds
