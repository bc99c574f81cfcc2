"""Generate the RetoolRun API reference (docs/api/retoolrun.md) from the pydantic model.

Run ``make api-docs`` (or ``python -m retool.spec.apidoc``). It reads the same structural schema
the CRD is generated from (``retool.spec.crd``), so every field, type, default, bound and
description is the model's; a test regenerates it and fails when the checked-in page differs.
One table per object, in the order a reader meets them (``spec``, then each nested object where
its field is listed).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from retool.spec.crd import PRINTER_COLUMNS, _model_schema, _without_defaults
from retool.spec.model import API_GROUP, API_VERSION, KIND, PLURAL, RetoolRunSpec
from retool.spec.status import RetoolRunStatus

HEADER = f"""# {KIND} API reference

<!-- Generated from retool/spec/model.py by `make api-docs`. Do not edit by hand. -->

Group `{API_GROUP}`, version `{API_VERSION}`, kind `{KIND}` (plural `{PLURAL}`, short name `rr`),
namespaced. The CRD (`charts/retool/crds/`) is generated from the same model; `kubectl explain
retoolrun.spec.<field>` prints the same descriptions, and `retool validate` applies the same types,
bounds and patterns (plus the cross-field rules in [../retoolrun.md](../retoolrun.md)). A field
left out takes its default; "—" means none (the field stays unset).
"""


def _anchor(path: str) -> str:
    return "".join(ch for ch in path.lower() if ch.isalnum() or ch in "-_ ").replace(" ", "-")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _type(node: dict[str, Any], child: str | None) -> str:
    if node.get("x-kubernetes-int-or-string"):
        return "quantity (integer or string)"
    kind = node.get("type")
    link = f" ([{child}](#{_anchor(child)}))" if child else ""
    if "enum" in node:
        return "one of " + ", ".join(f"`{v}`" for v in node["enum"])
    if kind == "array":
        items = node.get("items") or {}
        return f"list of {_type(items, child) if 'properties' in items else _type(items, None)}".replace(f"list of object{link}", f"list of objects{link}")
    if kind == "object" and "properties" not in node:
        values = node.get("additionalProperties")
        return f"map of string to {_type(values, None) if isinstance(values, dict) else 'anything'}"
    return f"{kind}{link}" if kind == "object" else str(kind)


def _constraints(node: dict[str, Any]) -> str:
    target = node.get("items") if node.get("type") == "array" and isinstance(node.get("items"), dict) else node
    parts = []
    if "minimum" in node:
        parts.append(f"{'>' if node.get('exclusiveMinimum') else '>='} {node['minimum']}")
    if "maximum" in node:
        parts.append(f"{'<' if node.get('exclusiveMaximum') else '<='} {node['maximum']}")
    for key, label in (("minLength", "length >="), ("maxLength", "length <="), ("minItems", "items >="), ("maxItems", "items <="), ("maxProperties", "entries <=")):
        if key in node:
            parts.append(f"{label} {node[key]}")
    pattern = node.get("pattern") or (target or {}).get("pattern")
    if pattern and not node.get("x-kubernetes-int-or-string"):
        parts.append(f"pattern `{pattern}`")
    return "; ".join(parts)


def _default(node: dict[str, Any]) -> str:
    if "default" not in node:
        return "—"
    return f"`{json.dumps(node['default'], separators=(', ', ': '))}`"


def _object_child(node: dict[str, Any]) -> dict[str, Any] | None:
    """The object a field leads to (itself, or its list items), when it has documented fields."""
    if "properties" in node:
        return node
    items = node.get("items")
    if isinstance(items, dict) and "properties" in items:
        return items
    return None


def _sections(path: str, node: dict[str, Any], *, defaults: bool) -> list[str]:
    rows = ["| field | type | default | constraints | description |", "|---|---|---|---|---|"] if defaults else ["| field | type | description |", "|---|---|---|"]
    nested: list[tuple[str, dict[str, Any]]] = []
    required = set(node.get("required") or ())
    for name, prop in node["properties"].items():
        child = _object_child(prop)
        child_path = f"{path}.{name}" + ("[]" if child is not None and prop.get("type") == "array" else "")
        if child is not None:
            nested.append((child_path, child))
        field = f"`{name}`" + (" (required)" if name in required else "")
        description = _cell(prop.get("description", ""))
        kind = _cell(_type(prop, child_path if child is not None else None))
        if defaults:
            rows.append(f"| {field} | {kind} | {_cell(_default(prop))} | {_cell(_constraints(prop))} | {description} |")
        else:
            rows.append(f"| {field} | {kind} | {description} |")
    out = [f"### {path}", "", _cell(node.get("description", "")).strip(), "", *rows, ""]
    for child_path, child in nested:
        out += _sections(child_path, child, defaults=defaults)
    return out


def render_api_reference() -> str:
    spec = _model_schema(RetoolRunSpec)
    spec["description"] = "Desired ReTool training pipeline: model, hardware, data, stages, sandbox and tracking."
    status = _without_defaults(_model_schema(RetoolRunStatus))
    status["description"] = "Observed state, written by the retool operator (read-only)."
    columns = ["| column | JSONPath | description |", "|---|---|---|"] + [
        f"| {c['name']} | `{c['jsonPath']}` | {_cell(c.get('description', ''))} |" for c in PRINTER_COLUMNS
    ]
    lines = [HEADER, "## Spec", "", *_sections("spec", spec, defaults=True), "## Status", "", *_sections("status", status, defaults=False)]
    lines += ["## Printer columns", "", "`kubectl get rr` shows:", "", *columns, ""]
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    sys.stdout.write(render_api_reference())
