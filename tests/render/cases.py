"""RetoolRuns the render tests cover: every example, and variants of them that flip the choices
the renderers branch on (algorithm, accelerator, node count, batch packing, stages, tracing)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import yaml

from retool.runtime.context import StageContext
from retool.spec.model import RetoolRun
from retool.spec.names import sandbox_url
from retool.spec.validate import parse_run
from tests.conftest import EXAMPLES

Doc = dict[str, Any]


def load_example(name: str) -> Doc:
    path = next(p for p in EXAMPLES if p.name == f"retoolrun-{name}.yaml")
    return yaml.safe_load(path.read_text())


def _set(doc: Doc, dotted: str, value: Any) -> Doc:
    doc = copy.deepcopy(doc)
    node = doc["spec"]
    *parents, leaf = dotted.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value
    return doc


def _variant(base: str, *changes: tuple[str, Any]) -> Callable[[], Doc]:
    def build() -> Doc:
        doc = load_example(base)
        for dotted, value in changes:
            doc = _set(doc, dotted, value)
        return doc

    return build


VARIANTS: dict[str, Callable[[], Doc]] = {
    **{p.stem.removeprefix("retoolrun-"): _variant(p.stem.removeprefix("retoolrun-")) for p in EXAMPLES},
    "qwen32b-h200-ppo": _variant("qwen32b-h200", ("rl.algorithm", "ppo")),
    "qwen7b-ascend-ppo": _variant("qwen7b-ascend", ("rl.algorithm", "ppo")),
    "qwen32b-on-ascend": _variant("qwen32b-h200", ("hardware.accelerator", "ascend"), ("hardware.product", None)),
    "qwen32b-two-nodes": _variant("qwen32b-h200", ("hardware.nodes", 2)),
    "qwen7b-ascend-two-nodes": _variant("qwen7b-ascend", ("hardware.nodes", 2)),
    "qwen32b-fixed-micro-batches-kl": _variant(
        "qwen32b-h200", ("rl.dynamicBatchSize", False), ("rl.useKlLoss", True), ("rl.klLossCoef", 0.001), ("rl.algorithm", "ppo")
    ),
    "qwen32b-traces": _variant("qwen32b-h200", ("rl.rolloutTraces", True)),
    "qwen32b-tool-turn-shaping": _variant("qwen32b-h200", ("rl.toolTurnShaping", True)),
    "minimal-no-sft": _variant("minimal", ("sft.enabled", False)),
    "minimal-no-rl": _variant("minimal", ("rl.enabled", False)),
    "minimal-no-preflight": _variant("minimal", ("preflight.enabled", False)),
    "minimal-external-mlflow": _variant("minimal", ("tracking.mlflow.trackingUri", "http://mlflow.example:5000")),
    "qwen7b-ascend-text-only": _variant("qwen7b-ascend", ("recipe", "text-only"), ("sft.enabled", False)),
    "qwen32b-text-only-ppo": _variant("qwen32b-h200-text-only", ("rl.algorithm", "ppo")),
}


def run_of(variant: str) -> RetoolRun:
    return parse_run(VARIANTS[variant]())


def context_of(run: RetoolRun, attempt: int = 1, mlflow: str | None = "http://retool-mlflow.retool-system.svc:5000") -> StageContext:
    namespace = run.metadata.namespace or "default"
    return StageContext(
        run_name=run.metadata.name,
        namespace=namespace,
        sandbox_url=sandbox_url(run.metadata.name, namespace),
        attempt=attempt,
        mlflow_tracking_uri=mlflow,
        mlflow_experiment=f"{namespace}/{run.metadata.name}",
    )
