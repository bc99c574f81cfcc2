"""Lock the trainer images' Python sets: one lock per image and platform, on top of the base's pins.

    python3 images/lock.py compile trainer-cuda [--date 2026-11-23]   # (re)write the lock files
    python3 images/lock.py check trainer-cuda                          # resolve again with the lock as constraints; exit 1 unless identical
    python3 images/lock.py base trainer-ascend > images/trainer-ascend/base.in   # INSIDE the base image: its real versions
    python3 images/lock.py check-base /opt/retool/base.in             # at image build time: the base is the one the lock was made for
    python3 images/lock.py pip-check trainer-ascend                   # at image build time: pip check, less what the base ships broken

Inputs per image (``images/<image>/``): ``base.in``, what the base image provides and what its own
packages require (``==`` pins of the accelerator stack the image must keep, and requirement
specifiers of the base's packages that our install must keep satisfied), and this project's
``dependencies`` plus its ``train`` extra from pyproject.toml. The resolver is uv, for the
image's Python version and platform: pip's ``--python-version``/``--platform`` still evaluates
environment markers for the interpreter running it (a py3.12 lock resolved from py3.11 drops
vLLM's ``setuptools<80; python_version > "3.11"``). ``--exclude-newer`` (the lock's date, in its
header) makes the resolve repeatable when upstream publishes new versions.

``base`` reads an installed base with ``importlib.metadata`` (``pip freeze`` prints editable
installs, such as vLLM in the Ascend base, as paths): the held packages' versions and the
requirements they declare, markers evaluated in the image.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import tomllib

IMAGES = Path(__file__).resolve().parent
REPO = IMAGES.parent
HEADER = "# Locked by images/lock.py"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==([^\s;#]+)")


@dataclass(frozen=True)
class Target:
    arch: str
    python: str
    platform: str
    """uv's --python-platform: the base's glibc (Ubuntu 22.04: 2.35) and architecture."""
    lock: str
    overrides: tuple[str, ...] = ()
    """Requirements that replace every other requirement on the same package (uv --overrides)."""
    cpu_torch: bool = False
    """The base has PyTorch's CPU build: drop what only PyPI's CUDA build of torch requires."""
    removed_by_base: tuple[str, ...] = ()
    """Packages the base uninstalls on purpose; never installed, whoever requires them (see KNOWN_UNMET)."""


CPU_TORCH_ONLY = re.compile(r"^nvidia-[a-z0-9-]+$")
"""Packages PyPI's torch wheel requires on x86_64 and PyTorch's CPU build does not."""

KNOWN_UNMET: dict[str, tuple[str, ...]] = {
    # vllm-ascend's Dockerfile uninstalls triton on x86_64 ("triton doesn't work correctly" on
    # Ascend), leaving xgrammar's `triton; platform_machine == "x86_64"` unmet in the base itself.
    "trainer-ascend": ("xgrammar 0.1.25 requires triton, which is not installed.",),
}
"""``pip check`` lines a base image ships with, the only ones an image build accepts."""


TARGETS: dict[str, tuple[Target, ...]] = {
    # vllm/vllm-openai:v0.11.0: Ubuntu 22.04, Python 3.12, x86_64
    "trainer-cuda": (Target("x86_64", "3.12", "x86_64-manylinux_2_35", "requirements.lock"),),
    # vllm/vllm-openai:v0.24.0: Ubuntu 22.04, Python 3.12, x86_64 (the 0.9 line: verl 0.9.1, CUDA 13, torch 2.11)
    "trainer-cuda-verl09": (Target("x86_64", "3.12", "x86_64-manylinux_2_35", "requirements.lock"),),
    # quay.io/ascend/vllm-ascend:v0.11.0rc1 (and -a3): Ubuntu 22.04, Python 3.11, published for arm64 and amd64
    "trainer-ascend": (
        Target("aarch64", "3.11", "aarch64-manylinux_2_35", "requirements-aarch64.lock"),
        # On x86_64 the base has torch 2.7.1+cpu from PyTorch's CPU index, and torch-npu's metadata
        # pins exactly that build. PyPI (the index the lock is made from) has only the CUDA build
        # of 2.7.1: its version stands in for both, and its CUDA-only dependencies are dropped.
        Target("x86_64", "3.11", "x86_64-manylinux_2_35", "requirements-x86_64.lock", overrides=("torch==2.7.1",), cpu_torch=True, removed_by_base=("triton",)),
    ),
}

HELD: dict[str, tuple[str, ...]] = {
    "trainer-cuda": ("vllm", "torch", "torchvision", "torchaudio", "triton", "xformers", "flashinfer-python"),
    "trainer-cuda-verl09": ("vllm", "torch", "torchvision", "torchaudio", "triton", "flashinfer-python", "flashinfer-cubin"),
    "trainer-ascend": ("torch", "torch-npu", "torchvision", "vllm", "vllm-ascend"),
}
"""The accelerator stack each base provides and the image keeps exactly (reading a real base pins these)."""

EXTRA: dict[str, str] = {"trainer-cuda-verl09": "train-verl09"}
"""The extra of pyproject.toml an image installs (its verl line, docs/verl-lines.md); ``train`` when not listed."""


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def public_version(version: str) -> str:
    """``2.7.1+cpu`` -> ``2.7.1``: ``==2.7.1`` accepts any local build, and the lock is about public releases."""
    return version.split("+", 1)[0]


def same_release(installed: str, pinned: str) -> bool:
    """PEP 440 equality of the public parts: ``13.0.3.0`` is what ``==13.0.3`` pins (torch's CUDA builds
    require ``cuda-toolkit==13.0.3`` and install a distribution that calls itself 13.0.3.0)."""
    from packaging.version import InvalidVersion, Version

    try:
        return Version(public_version(installed)) == Version(public_version(pinned))
    except InvalidVersion:
        return public_version(installed) == pinned


def image_extra(image: str) -> str:
    return EXTRA.get(image, "train")


def project_requirements(pyproject: Path = REPO / "pyproject.toml", extra: str = "train") -> list[str]:
    """What an image installs from this project: its dependencies and its extra (``train``, or its line's)."""
    project = tomllib.loads(pyproject.read_text())["project"]
    return [*project["dependencies"], *project["optional-dependencies"][extra]]


def pins(lines: Iterable[str]) -> dict[str, str]:
    """name -> version of every ``name==version`` line (comments and specifiers skipped)."""
    found = {}
    for line in lines:
        match = PIN.match(line.strip())
        if match:
            found[canonical(match.group(1))] = match.group(3)
    return found


def lock_date(lock: Path) -> str:
    for line in lock.read_text().splitlines():
        if line.startswith("# exclude-newer: "):
            return line.removeprefix("# exclude-newer: ").strip()
    raise ValueError(f"{lock} has no '# exclude-newer:' line: regenerate it with make lock")


def uv_binary() -> str:
    from uv import find_uv_bin

    return find_uv_bin()


def uv_environment() -> dict[str, str]:
    """This process's environment without the pip/uv settings and venv that would change what uv resolves."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("UV_", "PIP_", "VIRTUAL_ENV"))}


def uv_cache_dir() -> str:
    return str(Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"), "retool-uv"))


def resolve(image: str, target: Target, date: str, constraints: Path | None = None) -> str:
    """The locked set for one target: ``name==version`` lines, sorted (uv's output without its header)."""
    base = (constraints.parent if constraints is not None else IMAGES / image) / "base.in"
    env = uv_environment()
    with tempfile.TemporaryDirectory() as tmp:
        ours = Path(tmp, "project.in")
        ours.write_text("\n".join(project_requirements(extra=image_extra(image))) + "\n")
        args = [
            uv_binary(), "pip", "compile", "--no-config", "--quiet", "--no-header", "--annotation-style", "line",
            "--python-version", target.python, "--python-platform", target.platform, "--exclude-newer", date,
            "--cache-dir", uv_cache_dir(),
            str(base), str(ours),
        ]  # fmt: skip
        if constraints is not None:
            args += ["--constraints", str(constraints)]
        if target.overrides:
            overrides = Path(tmp, "overrides.txt")
            overrides.write_text("\n".join(target.overrides) + "\n")
            args += ["--overrides", str(overrides)]
        result = subprocess.run(args, capture_output=True, text=True, env=env, check=False, timeout=900)
    if result.returncode != 0:
        raise RuntimeError(f"resolving {image} for {target.platform} (python {target.python}) failed:\n{result.stderr[-4000:]}")
    locked = {}
    for line in result.stdout.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        requirement, _, via = line.partition("# via ")
        locked[requirement.strip()] = {canonical(v.strip()) for v in via.split(",") if v.strip()}
    if target.cpu_torch:
        locked = without_cuda_torch_deps(locked)
    removed = {canonical(name) for name in target.removed_by_base}
    locked = {r: via for r, via in locked.items() if canonical(r.split("==", 1)[0]) not in removed}
    return "".join(f"{requirement}\n" for requirement in locked)


def without_cuda_torch_deps(locked: dict[str, set[str]]) -> dict[str, set[str]]:
    """Drop the packages only PyPI's CUDA build of torch pulls in (checked: torch, or each other, is all that needs them)."""
    names = {requirement: canonical(requirement.split("==", 1)[0]) for requirement in locked}
    dropped = {name for name in names.values() if CPU_TORCH_ONLY.match(name)}
    for requirement, via in locked.items():
        if names[requirement] in dropped and not via <= {"torch"} | dropped:
            raise RuntimeError(f"{requirement} is required by {sorted(via - {'torch'} - dropped)}, not only by torch's CUDA build")
    return {r: via for r, via in locked.items() if names[r] not in dropped}


def lock_text(image: str, target: Target, date: str, body: str) -> str:
    return (
        f"{HEADER} for {image} ({target.arch}, Python {target.python}, {target.platform}): do not edit.\n"
        f"# Inputs: images/{image}/base.in and pyproject.toml (dependencies + {image_extra(image)}). Regenerate: make lock\n"
        f"# exclude-newer: {date}\n"
        f"{body}"
    )


def compile_image(image: str, date: str) -> None:
    for target in TARGETS[image]:
        path = IMAGES / image / target.lock
        path.write_text(lock_text(image, target, date, resolve(image, target, date)))
        sys.stderr.write(f"wrote {path.relative_to(REPO)}\n")


def check_image(image: str, images: Path = IMAGES) -> list[str]:
    """Differences between each committed lock and a fresh resolve with that lock as constraints (empty: up to date)."""
    problems = []
    for target in TARGETS[image]:
        path = images / image / target.lock
        committed = path.read_text()
        try:
            fresh = lock_text(image, target, lock_date(path), resolve(image, target, lock_date(path), constraints=path))
        except RuntimeError as err:
            problems.append(f"{path}: its inputs do not resolve with the lock as constraints (run make lock): {err}")
            continue
        if fresh != committed:
            old, new = pins(committed.splitlines()), pins(fresh.splitlines())
            changed = sorted(set(old.items()) ^ set(new.items()))
            problems.append(f"{path} is not what its inputs resolve to ({changed[:10]}): run make lock")
    return problems


def installed_base(image: str, held_names: Iterable[str] | None = None) -> str:
    """``base.in`` for the base image this runs in: held pins and their declared requirements, from importlib.metadata."""
    lines = [f"# {image} base, read from the installed distributions with importlib.metadata on {datetime.date.today()}"]
    held = {canonical(n) for n in (HELD[image] if held_names is None else held_names)}
    dists = {canonical(d.metadata["Name"]): d for d in importlib.metadata.distributions()}
    for name in sorted(held & dists.keys()):
        lines.append(f"{name}=={public_version(dists[name].version)}")
    from packaging.requirements import Requirement

    for name in sorted(held & dists.keys()):
        lines.append(f"# requirements of {name}")
        for spec in dists[name].requires or []:
            req = Requirement(spec)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            if canonical(req.name) not in held:
                req.marker = None
                lines.append(str(req))
    return "\n".join(lines) + "\n"


def pip_check(image: str) -> list[str]:
    """``pip check`` in the built image: every unmet requirement except those the base ships with."""
    result = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True, check=False)
    lines = [line.strip() for line in result.stdout.splitlines() if line.strip() and not line.startswith("No broken requirements")]
    return [line for line in lines if line not in KNOWN_UNMET.get(image, ())]


def check_base(base_in: Path) -> list[str]:
    """Held pins of ``base_in`` that the running base does not have (at image build time)."""
    problems = []
    for name, version in pins(base_in.read_text().splitlines()).items():
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            problems.append(f"{name}: the lock expects {version} from the base image, which does not install it")
            continue
        if not same_release(installed, version):
            problems.append(f"{name}: the base image has {installed}, the lock was made for {version}")
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="images/lock.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for command in ("compile", "check", "base", "pip-check"):
        p = sub.add_parser(command)
        p.add_argument("image", choices=sorted(TARGETS))
        if command == "compile":
            p.add_argument("--date", default=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT00:00:00Z"), help="exclude-newer cutoff")
    sub.add_parser("check-base").add_argument("base_in", type=Path)
    args = parser.parse_args(argv)
    if args.command == "compile":
        compile_image(args.image, args.date)
        return 0
    if args.command == "base":
        sys.stdout.write(installed_base(args.image))
        return 0
    checks = {"pip-check": lambda: pip_check(args.image), "check": lambda: check_image(args.image), "check-base": lambda: check_base(args.base_in)}
    problems = checks[args.command]()
    for problem in problems:
        sys.stderr.write(problem + "\n")
    if problems and args.command == "check-base":
        sys.stderr.write("regenerate the base pins inside the new base (make lock-base-IMAGE) and the locks (make lock)\n")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
