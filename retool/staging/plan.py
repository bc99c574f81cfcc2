"""What staging does for a run: a pure function of the spec (no I/O), table-tested."""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from retool.runtime.paths import run_paths, staged_model_path
from retool.spec.model import RetoolRun

SourceKind = Literal["hub", "s3", "pvc"]

OTHER_WEIGHT_FORMATS = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.h5", "*.msgpack", "*.ot", "*.onnx", "*.onnx_data", "*.gguf", "*.tflite")
"""Weight formats skipped when the model has safetensors (repos often ship both: twice the bytes)."""


class StagingError(RuntimeError):
    """The model cannot be staged; the message names the source and what to fix."""


@dataclass(frozen=True)
class StagingPlan:
    kind: SourceKind
    source: str
    destination: str
    revision: str | None = None
    endpoint: str | None = None
    """Hub endpoint (kind hub) or S3 endpoint (kind s3); None for the default."""
    region: str | None = None

    @property
    def copies(self) -> bool:
        """Whether bytes are copied (hub, s3) or a PVC path is used in place."""
        return self.kind != "pvc"


def staging_plan(run: RetoolRun) -> StagingPlan:
    model = run.spec.model
    base = model.base
    if base.startswith("/"):
        return StagingPlan(kind="pvc", source=base, destination=staged_model_path(run))
    destination = run_paths(run).base_model
    if base.startswith("s3://"):
        s3 = run.spec.storage.s3
        return StagingPlan(kind="s3", source=base.rstrip("/"), destination=destination, endpoint=s3.endpoint if s3 else None, region=s3.region if s3 else None)
    return StagingPlan(kind="hub", source=base, destination=destination, revision=model.revision, endpoint=model.hub_endpoint)


def select_files(names: Iterable[str]) -> list[str]:
    """The files of a model repository worth staging: all of them, minus duplicate weight formats when safetensors exist."""
    names = sorted(set(names))
    if not any(n.endswith(".safetensors") for n in names):
        return names
    return [n for n in names if not any(fnmatch.fnmatch(n.rsplit("/", 1)[-1], pattern) for pattern in OTHER_WEIGHT_FORMATS)]


def check_model_files(names: Iterable[str], where: str) -> None:
    """A directory that verl can load: a config.json and weights (or a checkpoint index)."""
    names = set(names)
    if "config.json" not in names:
        raise StagingError(f"{where} has no config.json: it is not a Hugging Face model directory")
    weights = [n for n in names if n.endswith((".safetensors", ".bin", ".safetensors.index.json", ".bin.index.json"))]
    if not weights:
        raise StagingError(f"{where} has a config.json but no weights (*.safetensors or *.bin)")
