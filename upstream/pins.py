"""The pinned upstream versions, read from upstream/versions.env (the file the Makefile includes)."""

from __future__ import annotations

import functools
from pathlib import Path

VERSIONS_FILE = Path(__file__).with_name("versions.env")
KUBERAY_MODULE = "github.com/ray-project/kuberay/ray-operator"


@functools.cache
def pins() -> dict[str, str]:
    """``NAME=value`` lines of versions.env (comments and blank lines skipped)."""
    out: dict[str, str] = {}
    for number, raw in enumerate(VERSIONS_FILE.read_text().splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise ValueError(f"{VERSIONS_FILE.name}:{number}: expected NAME=value, got {raw!r}")
        out[name.strip()] = value.strip()
    return out


def kuberay_version() -> str:
    """KubeRay's version as the Go module tags it, e.g. ``v1.6.1``."""
    return pins()["KUBERAY_VERSION"]


def kuberay_crd_dir(root: Path) -> Path:
    """Where ``make kuberay-crds`` puts KubeRay's CRDs for a checkout at ``root``."""
    return root / ".tools" / f"kuberay-{kuberay_version()}"
