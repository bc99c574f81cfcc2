"""Generate the RetoolRun CustomResourceDefinition from the pydantic models.

Run ``make crd`` (or ``python -m retool.spec.crd``). A test regenerates the CRD and fails when
the checked-in file in charts/retool/crds/ differs, so the model stays the one source.

Pydantic's JSON schema is close to, but not, a Kubernetes structural schema: it uses ``$ref``,
``anyOf`` with ``null`` for optional fields and ``title``s, and omits defaults built by factories. This module inlines references, drops nulls and titles, and
emits every default (``{}`` for a nested object whose fields all have defaults: the API server
defaults a missing property first, then descends into it), so ``kubectl get -o yaml`` shows the
effective values and the API server and pydantic agree on them.
"""

from __future__ import annotations

import sys
from typing import Any

import yaml
from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema

from retool.spec.model import API_GROUP, API_VERSION, KIND, PLURAL, RetoolRunSpec
from retool.spec.status import RetoolRunStatus

# propertyNames (label and annotation keys) has no counterpart in a structural schema; those keys
# are checked by the same pydantic model in the admission webhook and the operator.
_DROP = {"title", "$defs", "propertyNames"}


class _WithFactoryDefaults(GenerateJsonSchema):
    """Emit the value of ``default_factory`` defaults too (pydantic leaves them out).

    A factory that builds a model with all-default fields becomes ``{}`` (the nested defaults
    fill it); any other factory (the sandbox's resources, the eval sets) is emitted in full, so
    the API server and pydantic agree on what an omitted field means.
    """

    def default_schema(self, schema: Any) -> Any:
        factory = schema.get("default_factory")
        if factory is not None and not schema.get("default_factory_takes_data"):
            value = factory()
            if isinstance(value, BaseModel) and value == type(value)():
                value = {}
            schema = {k: v for k, v in schema.items() if k != "default_factory"} | {"default": value}
        return super().default_schema(schema)


YAML11_BOOLEANS = frozenset({"y", "Y", "yes", "Yes", "YES", "n", "N", "no", "No", "NO", "true", "True", "TRUE", "false", "False",
                             "FALSE", "on", "On", "ON", "off", "Off", "OFF"})
"""Strings that YAML 1.1 reads as booleans. Kubernetes (sigs.k8s.io/yaml over go-yaml v2) reads ``n:`` as the
key ``false``: the API server then serves ``spec.eval.false`` instead of ``spec.eval.n``. PyYAML quotes most
of these itself but not ``y``/``n``, so the dumper quotes them all."""


class _NoAliasDumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True


def _represent_str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    if data in YAML11_BOOLEANS:
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="'")
    return dumper.represent_str(data)


_NoAliasDumper.add_representer(str, _represent_str)


def _resolve(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        merged = {**defs[name], **{k: v for k, v in schema.items() if k != "$ref"}}
        return _resolve(merged, defs)
    return schema


def _structural(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Turn one pydantic JSON-schema node into a structural OpenAPI v3 node."""
    schema = _resolve(schema, defs)
    if "anyOf" in schema and not schema.get("x-kubernetes-int-or-string"):
        options = [option for option in schema["anyOf"] if option.get("type") != "null"]
        if len(options) != 1:
            raise ValueError(f"cannot express a union in a structural schema: {schema}")
        outer = {k: v for k, v in schema.items() if k not in ("anyOf",) and not (k == "default" and v is None)}
        return _structural({**_resolve(options[0], defs), **outer}, defs)

    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _DROP or (key == "default" and value is None):
            continue
        if key == "properties":
            out["properties"] = {name: _structural(prop, defs) for name, prop in value.items()}
        elif key == "items":
            out["items"] = _structural(value, defs)
        elif key == "additionalProperties":
            out["additionalProperties"] = _structural(value, defs) if isinstance(value, dict) else value
        elif key == "patternProperties":
            # pydantic writes a dict with constrained keys (label keys) this way; the API server refuses
            # patternProperties in a CRD ("Forbidden: patternProperties is not supported"), so the values'
            # schema becomes additionalProperties and the keys are checked like propertyNames above.
            values = list(value.values())
            if len(values) != 1:
                raise ValueError(f"cannot express several key patterns in a structural schema: {schema}")
            out["additionalProperties"] = _structural(values[0], defs)
        elif key == "const":
            out["enum"] = [value]
        elif key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
            # JSON Schema 2020-12 puts the bound here; OpenAPI v3.0 wants a flag beside it.
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        else:
            out[key] = value
    if out.get("additionalProperties") is False:
        # Structural schemas forbid unknown fields by pruning them; `false` is not allowed.
        del out["additionalProperties"]
    if "properties" in out:
        out["type"] = "object"
    first = [key for key in ("description", "type") if key in out]
    return {key: out[key] for key in first + [key for key in out if key not in first]}


def _without_defaults(schema: Any) -> Any:
    """Status is written by the operator only: defaults there would invent observations."""
    if isinstance(schema, dict):
        return {key: _without_defaults(value) for key, value in schema.items() if key != "default"}
    if isinstance(schema, list):
        return [_without_defaults(value) for value in schema]
    return schema


def _model_schema(model: type) -> dict[str, Any]:
    schema = model.model_json_schema(by_alias=True, mode="validation", schema_generator=_WithFactoryDefaults)
    return _structural(schema, schema.get("$defs", {}))


PRINTER_COLUMNS = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase", "description": "Where the pipeline is."},
    {"name": "Stage", "type": "string", "jsonPath": ".status.stage", "description": "Current stage."},
    {"name": "Progress", "type": "string", "jsonPath": ".status.progress", "description": "Progress of the current stage."},
    {"name": "AIME", "type": "number", "jsonPath": ".status.score", "description": "Headline eval score (mean@n of the first eval set)."},
    {
        "name": "Device-h",
        "type": "number",
        "jsonPath": ".status.cost.deviceHours",
        "description": "Device-hours the run has used, every stage and attempt, lost ones included (as of Observed).",
    },
    {"name": "Verl", "type": "string", "jsonPath": ".spec.trainer.verl", "priority": 1, "description": "Trainer line (spec.trainer.verl; empty: 0.6, the default)."},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    {
        "name": "Observed",
        "type": "date",
        "jsonPath": ".status.observedAt",
        "description": "How long ago the operator last looked (refreshed at least every 5 minutes while the run is unfinished: older means no operator is watching).",
    },
    {
        "name": "Message",
        "type": "string",
        "jsonPath": ".status.message",
        "description": "What the run waits for or why it stalls (at most 200 characters; the conditions carry the detail).",
    },
]


def build_crd() -> dict[str, Any]:
    """The complete CRD object."""
    spec_schema = _model_schema(RetoolRunSpec)
    spec_schema["description"] = "Desired ReTool training pipeline: model, hardware, data, stages, sandbox and tracking."
    status_schema = _without_defaults(_model_schema(RetoolRunStatus))
    status_schema["description"] = "Observed state, written by the retool operator."
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{PLURAL}.{API_GROUP}",
            "labels": {"app.kubernetes.io/name": "retool", "app.kubernetes.io/part-of": "retool"},
        },
        "spec": {
            "group": API_GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": KIND.lower(),
                "shortNames": ["rr"],
                "categories": ["retool", "all"],
            },
            "versions": [
                {
                    "name": API_VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "A ReTool training pipeline: cold-start SFT, checkpoint merge, multi-turn RL with a code sandbox, and AIME evaluation.",
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec_schema,
                                "status": status_schema,
                            },
                        }
                    },
                }
            ],
        },
    }


def render_crd() -> str:
    header = "# Generated from retool/spec/model.py by `make crd`. Do not edit by hand.\n"
    return header + yaml.dump(build_crd(), Dumper=_NoAliasDumper, sort_keys=False, width=120)


if __name__ == "__main__":
    sys.stdout.write(render_crd())
