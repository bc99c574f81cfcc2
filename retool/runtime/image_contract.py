"""What KubeRay and our stage pods execute in each trainer image, and a check that an image provides it.

A trainer image is run by programs we do not write: KubeRay starts the Ray head and workers with
``/bin/bash -c -- "ulimit -n ...; ray start ..."`` (a non-login shell: ``-l`` only when the
KubeRay operator's ``ENABLE_LOGIN_SHELL`` is true), and its K8sJobMode submitter Job runs
``/bin/bash -ce -- "until python -c '<GCS health>' ...; ray job submit ...; ray job logs --follow"``
(``retool_operator.kuberay_submitter``, ported from KubeRay 1.7). Ray 2.53+ nodes are probed over
HTTP (``/api/healthz``), so no ``wget`` is needed. Our own pods run ``python3 -m retool.stage``
(batch Jobs through ``retool.runtime.cpu_only``). The CANN environment must reach ``ray start``
and its workers without a login shell, so on Ascend it has to be in the image's ``ENV``; what the
CANN scripts in ``/etc/profile.d`` export is only read by login shells.

``python -m retool.runtime.image_contract check IMAGE`` is the last build step of each trainer
Dockerfile: it fails the build when a program is missing from PATH or when sourcing the CANN
scripts would still change a contract variable (the ``ENV`` does not carry it). The tests run
the same check, and run the submitter script with a PATH holding only the contract's programs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Program:
    name: str
    used_by: str


@dataclass(frozen=True)
class ImageContract:
    image: str
    programs: tuple[Program, ...]
    env_scripts: tuple[str, ...] = ()
    """Scripts (CANN's ``set_env.sh``) whose exports the image's ENV must already carry."""
    env_variables: tuple[str, ...] = ()
    """Variables those scripts set that every process needs without a login shell."""
    notes: tuple[str, ...] = field(default=())


COMMON_PROGRAMS = (
    Program("bash", "KubeRay's container command for Ray head/worker and submitter: /bin/bash -c[e] -- (no -l)"),
    Program("python", "KubeRay 1.7 submitter: `until python -c \"import urllib.request; ...\"` GCS health loop"),
    Program("python3", "stage entrypoints: `python3 -m retool.stage STAGE` (Jobs and the RayJob entrypoint)"),
    Program("ray", "KubeRay: `ray start` on head/worker; submitter: `ray job status|submit|logs`"),
    Program("sleep", "KubeRay 1.7 submitter: `sleep 2` between GCS health checks"),
)

CANN_SCRIPTS = ("/usr/local/Ascend/ascend-toolkit/set_env.sh", "/usr/local/Ascend/nnal/atb/set_env.sh")
CANN_VARIABLES = ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH", "ASCEND_OPP_PATH", "ASCEND_AICPU_PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "PATH", "ATB_HOME_PATH")

CONTRACTS: dict[str, ImageContract] = {
    "trainer-cuda": ImageContract("trainer-cuda", COMMON_PROGRAMS),
    "trainer-cuda-verl09": ImageContract("trainer-cuda-verl09", COMMON_PROGRAMS),
    "trainer-ascend": ImageContract(
        "trainer-ascend",
        COMMON_PROGRAMS,
        env_scripts=CANN_SCRIPTS,
        env_variables=CANN_VARIABLES,
        notes=("the CANN toolkit and NNAL (ATB) environment is in the image's ENV: `ray start` runs under `bash -c`, which reads no /etc/profile.d",),
    ),
}


def missing_programs(contract: ImageContract, path: str) -> list[str]:
    """Contract programs not found on ``path`` (a PATH value)."""
    return [p.name for p in contract.programs if shutil.which(p.name, path=path) is None]


def _entries(value: str) -> list[str]:
    return [e for e in value.split(os.pathsep) if e]


def sourced_environment(scripts: Sequence[str], environ: Mapping[str, str]) -> dict[str, str]:
    """The environment after a non-login bash sources ``scripts`` (those that exist) on top of ``environ``."""
    sources = " ; ".join(f'[ -f "{s}" ] && . "{s}"' for s in scripts)
    out = subprocess.run(
        ["bash", "-c", f"{sources} ; env -0"], env=dict(environ), capture_output=True, check=True, timeout=120
    ).stdout.decode()
    return dict(item.split("=", 1) for item in out.split("\0") if "=" in item)


def environment_gaps(contract: ImageContract, environ: Mapping[str, str], sourced: Mapping[str, str]) -> list[str]:
    """Contract variables whose value the CANN scripts would still change: the ENV does not carry them.

    A scalar must be equal; a path list must already hold every entry the scripts add (order and
    duplicates aside: the scripts prepend unconditionally).
    """
    gaps = []
    for name in contract.env_variables:
        after = sourced.get(name)
        if after is None:
            continue
        before = environ.get(name)
        if before is None:
            gaps.append(f"{name} is set only by sourcing {', '.join(contract.env_scripts)} (add it to the Dockerfile's ENV: {after})")
            continue
        if os.pathsep in after or os.pathsep in before or name in ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH"):
            extra = [e for e in _entries(after) if e not in _entries(before)]
            if extra:
                gaps.append(f"{name} lacks {os.pathsep.join(extra)} that {', '.join(contract.env_scripts)} add (add them to the Dockerfile's ENV)")
        elif after != before:
            gaps.append(f"{name} is {before!r} in the image but {after!r} after sourcing {', '.join(contract.env_scripts)}")
    return gaps


def check(contract: ImageContract, environ: Mapping[str, str]) -> list[str]:
    """Every way the running image breaks its contract, as sentences; empty when it keeps it."""
    missing = set(missing_programs(contract, environ.get("PATH", "")))
    problems = [f"`{p.name}` is not on PATH ({environ.get('PATH', '')}): {p.used_by}" for p in contract.programs if p.name in missing]
    if contract.env_scripts:
        present = [s for s in contract.env_scripts if os.path.isfile(s)]
        if not present:
            problems.append(f"none of {', '.join(contract.env_scripts)} exists: the CANN environment cannot be checked")
        else:
            problems += environment_gaps(contract, environ, sourced_environment(present, environ))
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m retool.runtime.image_contract", description=__doc__.split("\n", 1)[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("check", help="check this image against its contract (the last build step)")
    run.add_argument("image", choices=sorted(CONTRACTS))
    args = parser.parse_args(argv)
    problems = check(CONTRACTS[args.image], os.environ)
    for problem in problems:
        sys.stderr.write(f"image contract ({args.image}): {problem}\n")
    if not problems:
        contract = CONTRACTS[args.image]
        kept = f"{', '.join(p.name for p in contract.programs)} on PATH" + (", CANN environment in ENV" if contract.env_scripts else "")
        sys.stderr.write(f"image contract ({args.image}): {kept}\n")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
