"""The trainer images' Python sets are locked, per image and platform, on top of the base's pins.

The lock test resolves each image's inputs again (uv, the image's Python and platform, PyPI,
the lock's exclude-newer date) with the committed lock as constraints and fails unless the
result is exactly the lock: a changed pin in pyproject.toml or base.in without ``make lock``
fails here. New upstream releases cannot change the result (every package is pinned and the
date is fixed).
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
from pathlib import Path

import pytest
import tomllib

from tests.conftest import REPO

spec = importlib.util.spec_from_file_location("images_lock", REPO / "images" / "lock.py")
lock = importlib.util.module_from_spec(spec)
sys.modules["images_lock"] = lock
spec.loader.exec_module(lock)

LOCKS = [(image, target) for image, targets in lock.TARGETS.items() for target in targets]
LOCK_IDS = [f"{image}-{target.arch}" for image, target in LOCKS]


def locked(image: str, target) -> dict[str, str]:
    return lock.pins((REPO / "images" / image / target.lock).read_text().splitlines())


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version)[:4])


@pytest.mark.slow
@pytest.mark.parametrize("image", sorted(lock.TARGETS))
def test_each_lock_is_exactly_what_its_inputs_resolve_to(image: str) -> None:
    assert lock.check_image(image) == []


LOCKS_06 = [(i, t) for i, t in LOCKS if lock.image_extra(i) == "train"]


@pytest.mark.parametrize(("image", "target"), LOCKS_06, ids=[f"{image}-{target.arch}" for image, target in LOCKS_06])
def test_lock_holds_the_stack_verl_needs(image: str, target) -> None:
    pins = locked(image, target)
    assert pins["verl"] == "0.6.1"
    assert pins["hydra-core"].startswith("1.3.") and pins["omegaconf"].startswith("2.3.")
    assert pins["antlr4-python3-runtime"].startswith("4.9."), "hydra-core 1.x and omegaconf 2.x need antlr4 4.9"
    # verl 0.6.1 needs numpy<2; OpenCV 4.12 (what vLLM 0.11's images carry) needs numpy>=2, 4.11.0.86 is the last without
    assert version_tuple(pins["numpy"]) < (2,)
    assert version_tuple(pins["opencv-python-headless"]) <= (4, 11, 0, 86)


@pytest.mark.parametrize(("image", "target"), [(i, t) for i, t in LOCKS if lock.image_extra(i) == "train-verl09"], ids=lambda v: getattr(v, "arch", v))
def test_the_0_9_lines_lock_holds_the_stack_verl_0_9_1_needs(image: str, target) -> None:
    """verl 0.9.1's own requirements (its METADATA): transformers >=5.5.3,<5.11 and not 5.6.0, numpy >= 2,
    tensordict >=0.8,<=0.10 and not 0.9.0; vLLM >= 0.18 (the issue's floor; its vllm extra pins 0.24.0)."""
    pins = locked(image, target)
    assert pins["verl"] == "0.9.1"
    assert (5, 5, 3) <= version_tuple(pins["transformers"]) < (5, 11) and pins["transformers"] != "5.6.0"
    assert version_tuple(pins["numpy"]) >= (2,)
    assert (0, 8) <= version_tuple(pins["tensordict"]) <= (0, 10, 0) and not pins["tensordict"].startswith("0.9.0")
    assert version_tuple(pins["vllm"]) >= (0, 18)
    assert pins["hydra-core"].startswith("1.3.") and pins["antlr4-python3-runtime"].startswith("4.9.")


@pytest.mark.parametrize(("image", "target"), LOCKS, ids=LOCK_IDS)
def test_lock_keeps_the_base_pins_and_our_pins(image: str, target) -> None:
    pins = locked(image, target)
    base = lock.pins((REPO / "images" / image / "base.in").read_text().splitlines())
    assert {name: pins.get(name) for name in base} == base
    ours = lock.pins(lock.project_requirements(extra=lock.image_extra(image)))
    assert {name: pins.get(name) for name in ours} == ours
    assert all(lock.PIN.match(line) for line in (REPO / "images" / image / target.lock).read_text().splitlines() if not line.startswith("#"))


def test_ascend_x86_lock_has_no_cuda_libraries_or_triton() -> None:
    """The x86_64 Ascend base has PyTorch's CPU build and uninstalls triton on purpose."""
    [x86] = [t for t in lock.TARGETS["trainer-ascend"] if t.arch == "x86_64"]
    names = set(locked("trainer-ascend", x86))
    assert not [n for n in names if n.startswith("nvidia-") or n == "triton"]
    cuda = set(locked("trainer-cuda", lock.TARGETS["trainer-cuda"][0]))
    assert "nvidia-nccl-cu12" in cuda and "triton" in cuda


@pytest.mark.slow
def test_a_lock_that_disagrees_with_pyproject_is_caught(tmp_path: Path) -> None:
    images = tmp_path / "images"
    shutil.copytree(REPO / "images" / "trainer-cuda", images / "trainer-cuda")
    stale = images / "trainer-cuda" / "requirements.lock"
    stale.write_text(stale.read_text().replace("hydra-core==1.3.8", "hydra-core==1.3.2"))
    [problem] = lock.check_image("trainer-cuda", images)
    assert "hydra-core" in problem and "make lock" in problem


def test_project_requirements_are_pyprojects_dependencies_and_train_extra() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert lock.project_requirements() == project["dependencies"] + project["optional-dependencies"]["train"]


def test_base_is_read_with_importlib_metadata(tmp_path: Path) -> None:
    """What ``images/lock.py base`` prints inside a base image, here on this environment: versions from
    the installed metadata (also of editable installs, which pip freeze prints as paths), local build tags
    dropped (torch 2.13.0+cpu -> 2.13.0), and the held packages' own requirements."""
    import importlib.metadata

    text = lock.installed_base("trainer-cuda", held_names=("torch", "retool"))
    pins = lock.pins(text.splitlines())
    assert pins["torch"] == importlib.metadata.version("torch").split("+")[0]
    assert pins["retool"] == importlib.metadata.version("retool"), "the editable install reads as its version"
    assert "# requirements of torch" in text and "filelock" in text
    # and the build-time check reads it back the same way
    base_in = tmp_path / "base.in"
    base_in.write_text(text)
    assert lock.check_base(base_in) == []
    base_in.write_text("torch==2.8.0\nno-such-dist==1.0\n")
    problems = lock.check_base(base_in)
    assert any("torch: the base image has" in p and "made for 2.8.0" in p for p in problems)
    assert any("no-such-dist" in p and "does not install it" in p for p in problems)


@pytest.mark.parametrize(
    ("installed", "pinned", "same"),
    [
        ("13.0.3.0", "13.0.3", True),  # torch's CUDA build: cuda-toolkit==13.0.3 installs 13.0.3.0
        ("2.13.0+cpu", "2.13.0", True),
        ("2.13.0", "2.13.1", False),
        ("1.0rc1", "1.0", False),
        ("not a version", "not a version", True),
        ("not a version", "1.0", False),
    ],
)
def test_base_pins_compare_as_pep440_releases(installed: str, pinned: str, same: bool) -> None:
    assert lock.same_release(installed, pinned) is same
