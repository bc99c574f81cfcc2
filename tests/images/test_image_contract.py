"""Each trainer image keeps its written contract (retool.runtime.image_contract): the Dockerfile provides
it, the build checks it, and the check catches what a broken image lacks."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from retool.runtime.image_contract import CANN_VARIABLES, CONTRACTS, check, environment_gaps, missing_programs, sourced_environment
from tests.conftest import REPO, repo_env
from tests.images.dockerfile import parse

TRAINERS = ("trainer-cuda", "trainer-ascend")


def bin_dir(tmp_path: Path, programs: list[str]) -> str:
    d = tmp_path / "bin"
    d.mkdir(exist_ok=True)
    for name in programs:
        (d / name).write_text("#!/bin/sh\n")
        (d / name).chmod(0o755)
    return str(d)


@pytest.mark.parametrize("image", TRAINERS)
def test_the_dockerfile_gives_python_where_the_base_has_python3_only(image: str) -> None:
    runs = [i.args for i in parse(REPO / "images" / image / "Dockerfile").final.all("RUN")]
    assert 'command -v python >/dev/null || ln -s "$(command -v python3)" /usr/local/bin/python' in runs


@pytest.mark.parametrize("image", TRAINERS)
def test_the_contract_check_is_the_last_build_step_as_the_runtime_user(image: str) -> None:
    final = parse(REPO / "images" / image / "Dockerfile").final
    runs = final.all("RUN")
    assert runs[-1].args == f"python -m retool.runtime.image_contract check {image}"
    assert runs[-1].line > final.all("USER")[-1].line > max(i.line for i in final.all("ENV"))


def test_the_ascend_dockerfile_carries_every_cann_variable_in_env_not_a_profile_script() -> None:
    df = parse(REPO / "images" / "trainer-ascend" / "Dockerfile")
    env = " ".join(i.args for i in df.final.all("ENV"))
    for name in CANN_VARIABLES:
        assert re.search(rf"(^|\s){name}=", env), f"{name} is not set by an ENV instruction"
    assert "ASCEND_TOOLKIT_HOME}/lib64" in env and "op_tiling/lib/linux/aarch64" in env and "op_tiling/lib/linux/x86_64" in env
    assert "profile.d" not in " ".join(i.args for i in df.final.all("RUN"))


@pytest.mark.parametrize(
    ("present", "missing"),
    [
        pytest.param(["bash", "python", "python3", "ray", "sleep"], [], id="the fixed image has every program"),
        pytest.param(["bash", "python3", "ray", "sleep"], ["python"], id="a vLLM base alone lacks python for the submitter's health loop"),
        pytest.param(["python", "python3", "sleep"], ["bash", "ray"], id="an image without Ray cannot run ray start"),
    ],
)
def test_missing_programs(tmp_path: Path, present: list[str], missing: list[str]) -> None:
    assert missing_programs(CONTRACTS["trainer-cuda"], bin_dir(tmp_path, present)) == missing


CANN_SCRIPT = """\
export ASCEND_TOOLKIT_HOME={root}/latest
export LD_LIBRARY_PATH=${{ASCEND_TOOLKIT_HOME}}/lib64:$LD_LIBRARY_PATH
export PATH=${{ASCEND_TOOLKIT_HOME}}/bin:$PATH
export ASCEND_OPP_PATH=${{ASCEND_TOOLKIT_HOME}}/opp
"""


@pytest.mark.parametrize(
    ("image_env", "gaps"),
    [
        pytest.param(
            {},
            ["ASCEND_TOOLKIT_HOME is set only", "ASCEND_OPP_PATH is set only", "LD_LIBRARY_PATH is set only", "PATH lacks"],
            id="profile.d only: every variable is missing without a login shell",
        ),
        pytest.param(
            {"ASCEND_TOOLKIT_HOME": "{root}/latest", "ASCEND_OPP_PATH": "{root}/latest/opp", "LD_LIBRARY_PATH": "/usr/lib:{root}/latest/lib64", "PATH+": "{root}/latest/bin"},
            [],
            id="the ENV carries what the scripts export (order aside)",
        ),
        pytest.param(
            {"ASCEND_TOOLKIT_HOME": "/opt/other", "ASCEND_OPP_PATH": "{root}/latest/opp", "LD_LIBRARY_PATH": "{root}/latest/lib64", "PATH+": "{root}/latest/bin"},
            ["ASCEND_TOOLKIT_HOME is '/opt/other'"],
            id="a stale toolkit path in ENV",
        ),
    ],
)
def test_environment_gaps_find_what_only_the_cann_scripts_set(tmp_path: Path, image_env: dict[str, str], gaps: list[str]) -> None:
    root = str(tmp_path / "Ascend")
    script = tmp_path / "set_env.sh"
    script.write_text(CANN_SCRIPT.format(root=root))
    environ = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    for key, value in image_env.items():
        if key == "PATH+":
            environ["PATH"] = value.format(root=root) + os.pathsep + environ["PATH"]
        else:
            environ[key] = value.format(root=root)
    contract = dataclasses.replace(CONTRACTS["trainer-ascend"], env_scripts=(str(script),))
    found = environment_gaps(contract, environ, sourced_environment([str(script)], environ))
    assert len(found) == len(gaps), found
    for gap, text in zip(sorted(gaps), sorted(found), strict=True):
        assert text.startswith(gap), found


def test_the_check_names_the_missing_program_and_who_runs_it(tmp_path: Path) -> None:
    problems = check(CONTRACTS["trainer-cuda"], {"PATH": bin_dir(tmp_path, ["bash", "python3", "ray", "sleep"])})
    assert len(problems) == 1 and problems[0].startswith("`python` is not on PATH") and "until python -c" in problems[0]


def run_check(path: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "retool.runtime.image_contract", "check", "trainer-cuda"]
    return subprocess.run(command, env=repo_env(PATH=path), capture_output=True, text=True, timeout=60, check=False)


def test_the_check_command_fails_the_build_of_an_image_without_python(tmp_path: Path) -> None:
    result = run_check(bin_dir(tmp_path, ["bash", "python3", "ray", "sleep"]))
    assert result.returncode == 1 and "`python` is not on PATH" in result.stderr
    result = run_check(bin_dir(tmp_path, ["python"]))
    assert result.returncode == 0, result.stderr
