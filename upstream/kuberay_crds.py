"""Fetch KubeRay's CRDs (``config/crd/bases`` of its ray-operator Go module) at the pinned version.

``python -m upstream.kuberay_crds DEST`` asks ``go mod download`` for the module (the Go module
proxy and checksum database; cached in Go's module cache, so a second fetch reads the disk), then
copies the CRD files into DEST with a SOURCE file naming the module, version and checksum. The
manifest checks of the tests validate every RayJob and RayCluster against these schemas.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from upstream.pins import KUBERAY_MODULE, kuberay_version

CRD_DIR = "config/crd/bases"
REQUIRED = ("ray.io_rayjobs.yaml", "ray.io_rayclusters.yaml")


class FetchError(RuntimeError):
    """The module could not be fetched or does not hold the expected CRDs."""


def download(module: str, version: str) -> dict:
    """``go mod download -json`` of one module; its JSON answer (Dir, Sum, ...)."""
    go = shutil.which("go")
    if go is None:
        raise FetchError(f"`go` is not on PATH: the manifest checks fetch {module}@{version} with the Go toolchain (Go >= 1.21)")
    with tempfile.TemporaryDirectory() as outside_any_module:
        result = subprocess.run(
            [go, "mod", "download", "-json", f"{module}@{version}"], cwd=outside_any_module, capture_output=True, text=True, timeout=900, check=False
        )
    try:
        answer = json.loads(result.stdout)
    except json.JSONDecodeError:
        raise FetchError(f"go mod download {module}@{version} failed (exit {result.returncode}): {result.stderr.strip() or result.stdout.strip()}") from None
    if answer.get("Error") or not answer.get("Dir"):
        raise FetchError(f"go mod download {module}@{version}: {answer.get('Error') or 'no module directory'}")
    return answer


def fetch(dest: Path, version: str | None = None) -> list[Path]:
    """Copy the CRDs of KubeRay ``version`` (default: the pin) into ``dest``; the files written."""
    version = version or kuberay_version()
    answer = download(KUBERAY_MODULE, version)
    source = Path(answer["Dir"]) / CRD_DIR
    crds = sorted(source.glob("ray.io_*.yaml"))
    missing = [name for name in REQUIRED if not (source / name).is_file()]
    if missing:
        raise FetchError(f"{KUBERAY_MODULE}@{version} has no {', '.join(missing)} under {CRD_DIR}")
    staging = dest.with_name(dest.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for crd in crds:
        shutil.copyfile(crd, staging / crd.name)
    (staging / "SOURCE").write_text(f"{KUBERAY_MODULE}@{version} {answer.get('Sum', '')}\n{CRD_DIR}: {' '.join(c.name for c in crds)}\n")
    shutil.rmtree(dest, ignore_errors=True)
    staging.rename(dest)  # whole or nothing: a half-copied directory is never taken for the schemas
    return [dest / crd.name for crd in crds]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m upstream.kuberay_crds", description=__doc__.splitlines()[0])
    parser.add_argument("dest", type=Path, help="directory to (re)create with the CRD files")
    parser.add_argument("--version", help="KubeRay version (default: KUBERAY_VERSION of upstream/versions.env)")
    args = parser.parse_args(argv)
    try:
        files = fetch(args.dest, args.version)
    except (FetchError, subprocess.TimeoutExpired) as err:
        print(f"kuberay-crds: {err}", file=sys.stderr)
        return 1
    print(f"kuberay-crds: {len(files)} CRDs of KubeRay {args.version or kuberay_version()} in {args.dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
