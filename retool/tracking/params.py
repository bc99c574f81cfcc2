"""The RetoolRun spec as MLflow params: dotted camelCase keys, values within MLflow's limits.

``rl.batchSize=512``, ``data.eval.0.name=aime_2024``: the keys read like the YAML a user
wrote, so a param in the UI maps straight back to the field to change. MLflow caps keys at 250
and values at 6000 characters and refuses ``@`` and other characters in keys; a param can never
change once logged.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from retool.spec.model import RetoolRun

MAX_PARAM_KEY = 250
MAX_PARAM_VALUE = 6000
PARAMS_PER_BATCH = 100
"""MLflow's log_batch limit on params (MAX_PARAMS_TAGS_PER_BATCH)."""

_INVALID_KEY_CHARS = re.compile(r"[^/\w.\- :]")


def flatten(value: Any, prefix: str = "") -> dict[str, str]:
    """Nested mappings and lists to ``a.b.0.c`` keys; None (unset optional fields) is left out.

    Empty mappings and lists are kept as ``{}`` / ``[]`` so "explicitly empty" stays visible.
    """
    if isinstance(value, Mapping):
        if not value and prefix:
            return {prefix: "{}"}
        out: dict[str, str] = {}
        for key, item in value.items():
            out.update(flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    if isinstance(value, list | tuple):
        if not value:
            return {prefix: "[]"}
        out = {}
        for index, item in enumerate(value):
            out.update(flatten(item, f"{prefix}.{index}"))
        return out
    if value is None:
        return {}
    if isinstance(value, bool):
        return {prefix: "true" if value else "false"}
    return {prefix: value if isinstance(value, str) else json.dumps(value)}


def fit_value(value: str) -> str:
    """Values over 6000 characters keep their head and say how much was cut."""
    if len(value) <= MAX_PARAM_VALUE:
        return value
    marker = f"...[{len(value)} chars, truncated]"
    return value[: MAX_PARAM_VALUE - len(marker)] + marker


def mlflow_params(flat: Mapping[str, str]) -> dict[str, str]:
    """Keys sanitised (invalid characters -> ``_``) and checked for length and collisions; values fitted."""
    out: dict[str, str] = {}
    for key, value in flat.items():
        safe = _INVALID_KEY_CHARS.sub("_", key)
        if len(safe) > MAX_PARAM_KEY:
            raise ValueError(f"param key {key!r} is longer than MLflow's {MAX_PARAM_KEY} characters")
        if safe in out:
            raise ValueError(f"param keys collide in MLflow as {safe!r}")
        out[safe] = fit_value(str(value))
    return out


def spec_params(run: RetoolRun) -> dict[str, str]:
    """The run's whole spec (defaults filled in) as MLflow params."""
    return mlflow_params(flatten(run.spec.model_dump(by_alias=True, mode="json")))


def param_changes(existing: Mapping[str, str], wanted: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """(params still to log, keys whose logged value differs and cannot be changed in MLflow)."""
    new = {key: value for key, value in wanted.items() if key not in existing}
    changed = sorted(key for key, value in wanted.items() if key in existing and existing[key] != value)
    return new, changed


def batches(params: Mapping[str, str], size: int = PARAMS_PER_BATCH) -> list[dict[str, str]]:
    items = sorted(params.items())
    return [dict(items[i : i + size]) for i in range(0, len(items), size)]
