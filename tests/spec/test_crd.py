"""The CRD is generated from the model, structural, valid, and agrees with pydantic's defaults."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest
import yaml

from retool.spec.crd import render_crd
from retool.spec.kubeyaml import STR, resolve_plain
from retool.spec.model import RetoolRun
from tests.conftest import EXAMPLES, REPO

CRD_PATH = REPO / "charts/retool/crds/retoolruns.retool.dev.yaml"


@pytest.fixture(scope="module")
def crd() -> dict:
    return yaml.safe_load(CRD_PATH.read_text())


@pytest.fixture(scope="module")
def root_schema(crd) -> dict:
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_checked_in_crd_matches_the_model():
    assert CRD_PATH.read_text() == render_crd(), "CRD drifted from retool/spec/model.py: run `make crd`"


def test_crd_passes_kubernetes_validate_strict():
    tool = shutil.which("kubernetes-validate") or str(Path(sys.executable).parent / "kubernetes-validate")
    result = subprocess.run([tool, "--strict", str(CRD_PATH)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def _nodes(schema: dict, path: str = ""):
    yield path, schema
    for name, prop in schema.get("properties", {}).items():
        yield from _nodes(prop, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from _nodes(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _nodes(schema["additionalProperties"], f"{path}{{}}")


def test_schema_is_structural(root_schema):
    for path, node in _nodes(root_schema):
        if node.get("x-kubernetes-int-or-string"):
            assert [o["type"] for o in node["anyOf"]] == ["integer", "string"], path
            continue
        assert "type" in node, f"{path} has no type"
        assert "$ref" not in node and "anyOf" not in node and "title" not in node, path
        assert not ("properties" in node and "additionalProperties" in node), path
        assert "x-kubernetes-preserve-unknown-fields" not in node, f"{path}: every object is typed"
        # the API server refuses these in a CRD (apiextensions validation: "is not supported"); the
        # end-to-end tests install the CRD into a real kube-apiserver (tests/e2e)
        for refused in ("patternProperties", "propertyNames", "dependencies", "$schema", "definitions", "id"):
            assert refused not in node, f"{path}: {refused} is not supported in a CRD schema"


def test_every_spec_field_has_a_description(root_schema):
    for path, node in _nodes(root_schema["properties"]["spec"], "spec"):
        if path.endswith("{}") or path.endswith("[]"):
            continue
        assert node.get("description"), f"{path} lacks a description (kubectl explain would be empty)"


def test_crd_names_columns_and_status(crd):
    spec = crd["spec"]
    assert spec["names"]["shortNames"] == ["rr"] and "retool" in spec["names"]["categories"]
    version = spec["versions"][0]
    assert version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"]] == ["Phase", "Stage", "Progress", "AIME", "Device-h", "Verl", "Age", "Observed", "Message"]


def apply_crd_defaults(obj, schema):
    """The API server's structural defaulting: fill missing properties, then descend."""
    if isinstance(obj, dict):
        for name, prop in schema.get("properties", {}).items():
            if name not in obj and "default" in prop:
                obj[name] = copy.deepcopy(prop["default"])
        for name, value in obj.items():
            if name in schema.get("properties", {}):
                apply_crd_defaults(value, schema["properties"][name])
            elif isinstance(schema.get("additionalProperties"), dict):
                apply_crd_defaults(value, schema["additionalProperties"])
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for value in obj:
            apply_crd_defaults(value, schema["items"])
    return obj


def openapi_to_jsonschema(node):
    """Enough of OpenAPI v3.0 -> JSON Schema for jsonschema to check the examples."""
    if isinstance(node, dict):
        out = {k: openapi_to_jsonschema(v) for k, v in node.items() if not k.startswith("x-kubernetes")}
        for bound, flag in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
            if out.get(flag) is True:
                out[flag] = out.pop(bound)
        if node.get("x-kubernetes-int-or-string"):
            out.pop("pattern", None)
        if out.get("type") == "object" and "properties" in out:
            out["additionalProperties"] = False
        return out
    if isinstance(node, list):
        return [openapi_to_jsonschema(v) for v in node]
    return node


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_api_server_defaults_agree_with_pydantic_defaults(example, root_schema):
    document = yaml.safe_load(example.read_text())
    defaulted = apply_crd_defaults(copy.deepcopy(document), root_schema)
    assert RetoolRun.model_validate(defaulted) == RetoolRun.model_validate(document)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_examples_pass_the_crd_schema(example, root_schema):
    document = yaml.safe_load(example.read_text())
    schema = openapi_to_jsonschema(root_schema)
    schema["properties"]["metadata"] = {"type": "object"}
    jsonschema.Draft7Validator(schema).validate(apply_crd_defaults(document, root_schema))


def test_crd_schema_rejects_what_the_model_rejects(root_schema):
    schema = openapi_to_jsonschema(root_schema)
    bad = {"apiVersion": "retool.dev/v1alpha1", "kind": "RetoolRun", "metadata": {}, "spec": {"storage": {}, "rl": {"algorithm": "dpo"}}}
    errors = list(jsonschema.Draft7Validator(schema).iter_errors(bad))
    assert any(list(e.path) == ["spec", "rl", "algorithm"] for e in errors)


class _GoYamlV2Loader(yaml.SafeLoader):
    """Reads booleans as Kubernetes does (sigs.k8s.io/yaml over go-yaml v2, YAML 1.1): ``y``/``n`` too."""


_GO_YAML_BOOLS = {"y": True, "yes": True, "true": True, "on": True, "n": False, "no": False, "false": False, "off": False}
_GoYamlV2Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool",
    re.compile(r"^(?:y|Y|yes|Yes|YES|n|N|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF)$"),
    list("yYnNtTfFoO"),
)
_GoYamlV2Loader.add_constructor("tag:yaml.org,2002:bool", lambda loader, node: _GO_YAML_BOOLS[loader.construct_scalar(node).lower()])


def test_kubernetes_reads_the_crd_as_we_wrote_it():
    """An unquoted ``n:`` is the key ``false`` to the API server: it served ``spec.eval.false`` (found by tests/e2e)."""
    text = CRD_PATH.read_text()
    assert yaml.load(text, Loader=_GoYamlV2Loader) == yaml.safe_load(text)


def _names_and_values(schema: dict, path: str = "") -> Iterator[tuple[str, str]]:
    """(path, word) for every property name and enum value of an OpenAPI schema."""
    for name, sub in schema.get("properties", {}).items():
        yield f"{path}.{name}", name
        yield from _names_and_values(sub, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            yield from _names_and_values(schema[key], f"{path}[]")
    for branch in schema.get("anyOf", []) + schema.get("oneOf", []) + schema.get("allOf", []):
        yield from _names_and_values(branch, path)
    for value in schema.get("enum", []):
        if isinstance(value, str):
            yield f"{path}=", value


def yaml_ambiguous_words(schema: dict) -> list[str]:
    """Field names and enum values that YAML 1.1 (kubectl) reads as something other than the string itself."""
    return [f"{path} {word!r}" for path, word in _names_and_values(schema) if resolve_plain(word) != (STR, word)]


KUBERNETES_OWN_VALUES = {
    ".status.conditions[].status= 'True'",  # metav1.Condition; written by the operator as JSON, never by a user
    ".status.conditions[].status= 'False'",
    ".spec.pods.volumes[].emptyDir.medium= ''",  # core/v1 EmptyDirVolumeSource; an empty plain scalar is null in any YAML
}
"""Values the Kubernetes API itself defines, copied into the schema unchanged."""


def test_no_field_name_or_enum_value_is_a_word_yaml_1_1_reads_otherwise(root_schema):
    """``n:`` reached the API server as ``false:`` (kubectl 1.33); no name or value may depend on a YAML dialect."""
    assert [word for word in yaml_ambiguous_words(root_schema) if word not in KUBERNETES_OWN_VALUES] == []


@pytest.mark.parametrize(
    ("schema", "found"),
    [
        ({"properties": {"eval": {"properties": {"n": {"type": "integer"}}}}}, [".eval.n 'n'"]),
        ({"properties": {"mode": {"type": "string", "enum": ["auto", "on", "off"]}}}, [".mode= 'on'", ".mode= 'off'"]),
        ({"properties": {"ports": {"additionalProperties": {"properties": {"0o17": {}}}}}}, [".ports[].0o17 '0o17'"]),
        ({"properties": {"x": {"anyOf": [{"properties": {"null": {}}}]}}}, [".x.null 'null'"]),
    ],
    ids=["a field named n", "enum values on and off", "a number-like name under a map", "null inside anyOf"],
)
def test_the_ambiguity_check_finds_each_kind_of_word(schema, found):
    assert yaml_ambiguous_words(schema) == found
