"""The project's manifest checker: what the API server would say about the objects we create.

Core kinds go through kubernetes-validate ``--strict`` (the official OpenAPI schemas of
``K8S_VERSION``); Ray kinds through the CRD schemas of the pinned KubeRay, fetched from its Go module
by ``make kuberay-crds`` (upstream/kuberay_crds.py) — types, required fields, enums, and the fields a
structural schema would prune silently (the API server drops an unknown field of a custom resource
without an error, so a misspelt RayJob field would otherwise pass unnoticed).

A missing schema directory is an error, never a skip: a checker without its inputs proves nothing.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

from tests.conftest import KUBERAY_SCHEMAS
from upstream.pins import kuberay_version

K8S_VERSION = "1.33.0"
"""The Kubernetes whose OpenAPI schemas core objects are checked against (the user-namespace pod shape
the chart turns on by default needs 1.33)."""
ROOT_FIELDS = ("apiVersion", "kind", "metadata")


class MissingSchemasError(FileNotFoundError):
    """The KubeRay CRDs are not where ``make kuberay-crds`` puts them."""


def _defaults_satisfy_required(schema: Any) -> Any:
    """A field with a ``default`` is filled in by the API server before validation: never missing."""
    if isinstance(schema, dict):
        properties = schema.get("properties") or {}
        if "required" in schema:
            schema["required"] = [name for name in schema["required"] if "default" not in properties.get(name, {})]
        for value in schema.values():
            _defaults_satisfy_required(value)
    elif isinstance(schema, list):
        for value in schema:
            _defaults_satisfy_required(value)
    return schema


YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's safe loader where PyYAML was built with it (the wheels are): the same documents as
``yaml.safe_load``, and the KubeRay CRDs (4 MB) parse in ~0.7 s instead of ~8 s."""


def crd_schemas(directory: Path = KUBERAY_SCHEMAS) -> dict[tuple[str, str], dict[str, Any]]:
    """``(apiVersion, kind) -> openAPIV3Schema`` of every CRD in ``directory``, read once per process
    and directory however it is named (``crd_schemas()`` and ``crd_schemas(KUBERAY_SCHEMAS)`` share
    one entry). Callers only read the mapping."""
    return _crd_schemas(directory.resolve())


@functools.cache
def _crd_schemas(directory: Path) -> dict[tuple[str, str], dict[str, Any]]:
    files = sorted(directory.glob("*.yaml")) if directory.is_dir() else []
    if not files:
        raise MissingSchemasError(f"no KubeRay CRDs in {directory}: run `make kuberay-crds` (fetches KubeRay {kuberay_version()} from its Go module)")
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for path in files:
        crd = yaml.load(path.read_text(), Loader=YAML_LOADER)
        spec = crd["spec"]
        for version in spec["versions"]:
            schema = copy.deepcopy(version["schema"]["openAPIV3Schema"])
            out[(f"{spec['group']}/{version['name']}", spec["names"]["kind"])] = _defaults_satisfy_required(schema)
    return out


def pruned_fields(obj: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """The paths in ``obj`` a structural schema does not know: the API server would drop them."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    found: list[str] = []
    if isinstance(obj, dict) and "properties" in schema:
        keep_root = path == "" or schema.get("x-kubernetes-embedded-resource")
        for key, value in obj.items():
            if key in schema["properties"]:
                found += pruned_fields(value, schema["properties"][key], f"{path}.{key}")
            elif not (keep_root and key in ROOT_FIELDS) and not schema.get("additionalProperties"):
                found.append(f"{path}.{key}")
    elif isinstance(obj, dict) and isinstance(schema.get("additionalProperties"), dict):
        for key, value in obj.items():
            found += pruned_fields(value, schema["additionalProperties"], f"{path}.{key}")
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for index, value in enumerate(obj):
            found += pruned_fields(value, schema["items"], f"{path}[{index}]")
    return found


def problems(objects: Iterable[dict[str, Any]], *, k8s_version: str = K8S_VERSION, schemas_dir: Path = KUBERAY_SCHEMAS) -> list[str]:
    """One line per problem, ``Kind/name: where: what``; empty when every object would be accepted
    as written. Our own RetoolRun resources are checked by their model, not here."""
    ray = crd_schemas(schemas_dir)
    found: list[str] = []
    for obj in objects:
        key = (obj.get("apiVersion", ""), obj.get("kind", ""))
        name = f"{obj.get('kind')}/{(obj.get('metadata') or {}).get('name')}"
        if key in ray:
            validator = jsonschema.Draft7Validator(ray[key])
            found += [f"{name}: {'.'.join(map(str, e.path)) or '<root>'}: {e.message[:160]}" for e in validator.iter_errors(obj)]
            found += [f"{name}: unknown field {p} (would be pruned)" for p in pruned_fields(obj, ray[key])]
        elif key[0].startswith("ray.io/"):
            found.append(f"{name}: {key[0]} {key[1]} is not served by KubeRay {kuberay_version()}")
        elif key[0].startswith("retool.dev/"):
            continue
        else:
            try:
                kubernetes_validate.validate(obj, k8s_version, strict=True)
            except kubernetes_validate.ValidationError as err:
                found.append(f"{name}: {err.message[:200]}")
            except kubernetes_validate.SchemaNotFoundError:
                found.append(f"{name}: no Kubernetes {k8s_version} schema for {key[0]} {key[1]}")
    return found
