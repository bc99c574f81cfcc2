"""`retool validate` says what the operator would refuse, with the operator's settings `retool render
--manifests` uses: a file validate accepts renders, and one render refuses fails validation."""

from __future__ import annotations

import subprocess
import sys

import pytest

from retool.cli import extras_providing
from retool.cli.inputs import InputError, operator_settings
from retool.spec.operator_rules import OperatorSettings
from tests.conftest import REPO, repo_env

VOLCANO = str(REPO / "examples/retoolrun-qwen32b-volcano.yaml")
KUEUE = str(REPO / "examples/retoolrun-qwen32b-kueue.yaml")
MINIMAL = str(REPO / "examples/retoolrun-minimal.yaml")


def cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "retool.cli", *args], cwd=REPO, env=repo_env(**env), capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    ("file", "flags", "env", "field"),
    [
        pytest.param(VOLCANO, (), {}, "spec.scheduling.gang.enabled", id="gang scheduling is refused by the chart's default operator, which has no batch scheduler"),
        pytest.param(KUEUE, (), {"RETOOL_OPERATOR_BATCH_SCHEDULER": "volcano"}, "spec.scheduling.queueName", id="Kueue is refused where KubeRay runs volcano (variable)"),
        pytest.param(KUEUE, ("--batch-scheduler", "yunikorn"), {}, "spec.scheduling.queueName", id="Kueue is refused where KubeRay runs yunikorn (flag)"),
        pytest.param(MINIMAL, ("--sandbox-max-replicas", "4"), {}, "spec.sandbox.maxConcurrent", id="more sandbox replicas than the operator allows"),
    ],
)
def test_validate_and_render_refuse_what_the_operator_refuses(file: str, flags: tuple[str, ...], env: dict[str, str], field: str) -> None:
    validated = cli("validate", *flags, file, **env)
    assert validated.returncode == 1 and f"{file}#0: {field}: " in validated.stdout, validated.stdout + validated.stderr
    rendered = cli("render", "--manifests", *flags, file, **env)
    assert rendered.returncode == 1 and rendered.stderr.startswith(f"retool render: {file}: {field}: "), rendered.stderr
    assert "Traceback" not in rendered.stderr and not rendered.stdout


@pytest.mark.parametrize(
    ("file", "flags", "env"),
    [
        pytest.param(VOLCANO, ("--batch-scheduler", "volcano"), {}, id="gang scheduling with the batch scheduler named by the flag"),
        pytest.param(VOLCANO, (), {"RETOOL_OPERATOR_BATCH_SCHEDULER": "volcano"}, id="gang scheduling with the operator's own variable"),
        pytest.param(KUEUE, ("--batch-scheduler", "none"), {"RETOOL_OPERATOR_BATCH_SCHEDULER": "volcano"}, id="the flag overrides the variable"),
    ],
)
def test_what_the_operator_accepts_validates_and_renders(file: str, flags: tuple[str, ...], env: dict[str, str]) -> None:
    validated = cli("validate", *flags, file, **env)
    assert validated.returncode == 0, validated.stdout + validated.stderr
    rendered = cli("render", "--manifests", *flags, file, **env)
    assert rendered.returncode == 0 and "kind: RayJob" in rendered.stdout, rendered.stderr


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RETOOL_OPERATOR_BATCH_SCHEDULER": "slurm"}, "batch scheduler 'slurm' is not one of none, volcano, yunikorn"),
        ({"RETOOL_OPERATOR_SANDBOX_MAX_REPLICAS": "many"}, "RETOOL_OPERATOR_SANDBOX_MAX_REPLICAS='many' is not an integer"),
        ({"RETOOL_OPERATOR_SANDBOX_MAX_REPLICAS": "0"}, "sandbox max replicas 0 is not within 1..1024"),
    ],
    ids=["an unknown batch scheduler", "a replica limit that is not a number", "a replica limit below 1"],
)
def test_bad_operator_settings_are_one_line(env: dict[str, str], message: str) -> None:
    with pytest.raises(InputError, match=message):
        operator_settings(None, None, env)


def test_no_settings_are_the_charts_defaults() -> None:
    assert operator_settings(None, None, {}) == OperatorSettings(batch_scheduler="", sandbox_max_replicas=256)


REQUIREMENTS = [
    "pydantic==2.14.3",
    'kopf==1.45.2; extra == "operator"',
    'pydantic-settings==2.16.3; extra == "operator"',
    'pydantic-settings==2.16.3; extra == "sandbox"',
    'fastapi==0.165.0; extra == "sandbox"',
    'uvicorn==0.54.0; extra == "sandbox"',
    'retool[operator,sandbox]; extra == "dev"',
    'moto[server]==5.2.5; extra == "dev"',
]


@pytest.mark.parametrize(
    ("module", "extras"),
    [
        ("kopf", ["operator"]),
        ("pydantic_settings", ["operator", "sandbox"]),
        ("moto.server", ["dev"]),
        ("yaml", []),
    ],
    ids=["a module of one extra", "the smallest extra first (operator, then sandbox)", "dev only when nothing smaller has it", "a module named unlike its distribution"],
)
def test_the_missing_extra_is_the_smallest_that_installs_the_module(module: str, extras: list[str]) -> None:
    assert extras_providing(module, REQUIREMENTS) == extras
