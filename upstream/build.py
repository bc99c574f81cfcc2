"""Build the control plane's programs from their Go modules, once per version, into a cache outside the
checkout.

Each program is built in a small wrapper module of our own (generated here, never upstream code) that
requires the upstream module at the pinned version: ``go build`` then fetches the module and its
dependencies through the Go module proxy, like pip fetches packages, and verifies them against the
checksum database. ``k8s.io/kubernetes`` cannot be required as is: its go.mod points its staging modules
(``k8s.io/api``, ``k8s.io/apiserver`` ...) at ``./staging/src/...`` and requires them at ``v0.0.0``; the
wrapper replaces each with the published module of the same release (Kubernetes ``v1.X.Y`` publishes its
staging modules as ``v0.X.Y``), the usual way to build it outside its repository. etcd's server module
has the same kind of relative replaces, ignored when it is a dependency, so its wrapper needs none.

Binaries land in ``${XDG_CACHE_HOME:-~/.cache}/retool/upstream/<name>-<version>/<binary>`` (override with
``RETOOL_UPSTREAM_CACHE``); one that exists is not rebuilt.

    python -m upstream.build            # build what is missing, print one line per program
    python -m upstream.build kwok etcd  # only these
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from upstream import pins as pins_module

WRAPPER_MODULE = "retool.dev/upstream-build"
"""Module path of our generated wrapper modules (never published; the name only has to be valid)."""


class BuildError(RuntimeError):
    """A program could not be built; the message names it, its module and version, and go's output."""


@dataclass(frozen=True)
class Program:
    """One binary: built from ``package`` (a main package) of ``module`` at the version pinned as ``pin``."""

    name: str
    module: str
    package: str
    pin: str
    binary: str

    def version(self, pins: dict[str, str]) -> str:
        try:
            return pins[self.pin]
        except KeyError:
            raise BuildError(f"{self.name}: {self.pin} is not set in upstream/versions.env") from None


KUBERNETES = "k8s.io/kubernetes"

PROGRAMS: dict[str, Program] = {
    p.name: p
    for p in (
        Program("etcd", "go.etcd.io/etcd/server/v3", "go.etcd.io/etcd/server/v3", "ETCD_VERSION", "etcd"),
        Program("kube-apiserver", KUBERNETES, f"{KUBERNETES}/cmd/kube-apiserver", "KUBERNETES_VERSION",
                "kube-apiserver"),
        Program("kube-controller-manager", KUBERNETES, f"{KUBERNETES}/cmd/kube-controller-manager",
                "KUBERNETES_VERSION", "kube-controller-manager"),
        Program("kube-scheduler", KUBERNETES, f"{KUBERNETES}/cmd/kube-scheduler", "KUBERNETES_VERSION",
                "kube-scheduler"),
        Program("kwok", "sigs.k8s.io/kwok", "sigs.k8s.io/kwok/cmd/kwok", "KWOK_VERSION", "kwok"),
        Program("kuberay-operator", "github.com/ray-project/kuberay/ray-operator",
                "github.com/ray-project/kuberay/ray-operator", "KUBERAY_VERSION", "ray-operator"),
        Program("kueue", "sigs.k8s.io/kueue", "sigs.k8s.io/kueue/cmd/kueue", "KUEUE_VERSION", "kueue"),
    )
}

_STAGING_REPLACE = re.compile(r"^\s*(?:replace\s+)?(k8s\.io/[\w.-]+)\s*=>\s*\./staging/src/\1\s*$", re.M)


def staging_modules(kubernetes_go_mod: str) -> list[str]:
    """The staging modules k8s.io/kubernetes replaces with its own directories, from its go.mod."""
    return sorted(set(_STAGING_REPLACE.findall(kubernetes_go_mod)))


def staging_version(kubernetes_version: str) -> str:
    """The published version of the staging modules of a Kubernetes release: ``v1.36.3`` -> ``v0.36.3``."""
    match = re.fullmatch(r"v1\.(\d+\.\d+)", kubernetes_version)
    if not match:
        raise BuildError(f"KUBERNETES_VERSION {kubernetes_version!r} is not a v1.X.Y release")
    return f"v0.{match.group(1)}"


def wrapper_go_mod(program: Program, version: str, *, staging: list[str] = ()) -> str:
    """Our go.mod that builds ``program`` at ``version``: one requirement, and for Kubernetes one replace
    per staging module to its published release."""
    lines = [f"module {WRAPPER_MODULE}/{program.name}", "", "go 1.26.0", "", f"require {program.module} {version}"]
    if staging:
        published = staging_version(version)
        lines += ["", "replace ("] + [f"\t{m} => {m} {published}" for m in staging] + [")"]
    return "\n".join(lines) + "\n"


def ldflags(program: Program, version: str) -> str:
    """Version stamps the upstream release builds set (Kubernetes' hack/lib/version.sh): without them
    kube-apiserver reports v0.0.0, which Helm's ``kubeVersion`` checks and clients' skew checks read."""
    if program.module != KUBERNETES:
        return "-s -w"
    major, minor = version.removeprefix("v").split(".")[:2]
    stamps = {"gitVersion": version, "gitMajor": major, "gitMinor": minor, "gitTreeState": "clean"}
    flags = [f"-X k8s.io/{pkg}.{key}={value}" for pkg in ("client-go/pkg/version", "component-base/version")
             for key, value in stamps.items()]
    return " ".join(["-s -w", *flags])


def cache_root() -> Path:
    if os.environ.get("RETOOL_UPSTREAM_CACHE"):
        return Path(os.environ["RETOOL_UPSTREAM_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "retool" / "upstream"


def binary_path(program: Program, pins: dict[str, str], root: Path | None = None) -> Path:
    return (root or cache_root()) / f"{program.name}-{program.version(pins)}" / program.binary


def _go() -> str:
    go = shutil.which("go")
    if not go:
        raise BuildError(
            "go is not on PATH: the end-to-end control plane is built from Go modules and needs Go >= 1.26 "
            "(https://go.dev/dl/) and access to the Go module proxy"
        )
    return go


def _run_go(args: list[str], cwd: Path, what: str, env: dict[str, str]) -> str:
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-30:])
        raise BuildError(f"{what} failed (exit {proc.returncode}): {' '.join(args[1:])}\n{tail}")
    return proc.stdout


def _kubernetes_staging(go: str, version: str, workdir: Path, env: dict[str, str]) -> list[str]:
    """Download k8s.io/kubernetes at ``version`` and read its staging replaces from its go.mod."""
    out = _run_go([go, "mod", "download", "-json", f"{KUBERNETES}@{version}"], workdir,
                  f"downloading {KUBERNETES}@{version}", env)
    go_mod = Path(re.search(r'"GoMod":\s*"([^"]+)"', out).group(1)).read_text()
    found = staging_modules(go_mod)
    if not found:
        raise BuildError(f"{KUBERNETES}@{version}: no ./staging/src replaces in its go.mod; the wrapper "
                         "module does not know how to build this release")
    return found


def build(program: Program, pins: dict[str, str], *, root: Path | None = None) -> tuple[Path, float | None]:
    """Build ``program`` unless its binary exists; returns the binary and the seconds spent (None: cached)."""
    target = binary_path(program, pins, root)
    if target.is_file() and os.access(target, os.X_OK):
        return target, None
    version = program.version(pins)
    go = _go()
    started = time.monotonic()
    workdir = (root or cache_root()) / "build" / f"{program.name}-{version}"
    workdir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, CGO_ENABLED="0", GOFLAGS=(os.environ.get("GOFLAGS", "") + " -buildvcs=false").strip())
    staging = _kubernetes_staging(go, version, workdir, env) if program.module == KUBERNETES else []
    (workdir / "go.mod").write_text(wrapper_go_mod(program, version, staging=staging))
    partial = target.with_name(target.name + ".partial")
    partial.parent.mkdir(parents=True, exist_ok=True)
    _run_go([go, "build", "-mod=mod", "-trimpath", "-ldflags", ldflags(program, version), "-o", str(partial),
             program.package], workdir, f"building {program.name} ({program.package}@{version})", env)
    partial.replace(target)
    return target, time.monotonic() - started


def build_all(names: list[str] | None = None, *, pins: dict[str, str] | None = None,
              log=None) -> dict[str, Path]:
    """Build (or find cached) every named program; the first failure stops with a BuildError."""
    pins = pins if pins is not None else pins_module.pins()
    unknown = sorted(set(names or []) - set(PROGRAMS))
    if unknown:
        raise BuildError(f"unknown program(s) {', '.join(unknown)}; known: {', '.join(PROGRAMS)}")
    paths = {}
    for name in names or list(PROGRAMS):
        program = PROGRAMS[name]
        path, seconds = build(program, pins)
        if log:
            state = "cached" if seconds is None else f"built in {seconds:.0f} s"
            log(f"{name:<24} {program.version(pins):<9} {state:<16} {path}")
        paths[name] = path
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m upstream.build", description=__doc__.split("\n\n")[0])
    parser.add_argument("programs", nargs="*", help=f"default: all ({', '.join(PROGRAMS)})")
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        build_all(args.programs or None, log=lambda line: print(line, flush=True))
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"control plane programs ready in {time.monotonic() - started:.0f} s (cache {cache_root()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
