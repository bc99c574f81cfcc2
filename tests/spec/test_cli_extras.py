"""Each image installs only its extra: the CLI must work for what is installed and name what is not."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES, OPERATOR_OF_EXAMPLE, REPO, repo_env

BLOCKER = """
import sys
BLOCKED = {"pydantic_settings", "numpy", "pyarrow", "httpx", "boto3", "mlflow", "verl", "fastapi"}
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Block())
"""


def run_without_extras(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """``python -m retool.cli`` as in an image with only the base package (pydantic, PyYAML)."""
    (tmp_path / "sitecustomize.py").write_text(BLOCKER)
    env = repo_env()
    env["PYTHONPATH"] = f"{tmp_path}:{env['PYTHONPATH']}"
    return subprocess.run([sys.executable, "-m", "retool.cli", *args], capture_output=True, text=True, env=env, cwd=REPO, timeout=120)


def test_validate_and_render_need_only_the_base_package(tmp_path: Path) -> None:
    for example in EXAMPLES:
        validated = run_without_extras(tmp_path, "validate", *OPERATOR_OF_EXAMPLE.get(example.stem, ()), str(example))
        assert validated.returncode == 0, validated.stdout
    rendered = run_without_extras(tmp_path, "render", "--stage", "rl", str(EXAMPLES[0]))
    assert rendered.returncode == 0, rendered.stderr
    assert "retool.recipe.verl_plugins.main_ppo" in rendered.stdout


@pytest.mark.parametrize(
    ("args", "extra"),
    [
        (("sandbox", "serve"), "sandbox"),
        (("data", "prepare", "rl", "--source", "x.parquet", "--out", "y.parquet"), "train"),
        (("render", "--manifests", str(REPO / "examples/retoolrun-minimal.yaml")), "operator"),
    ],
    ids=["sandbox serve", "data prepare", "render --manifests needs the operator extra, not dev"],
)
def test_a_command_whose_extra_is_missing_names_it(tmp_path: Path, args: tuple[str, ...], extra: str) -> None:
    result = run_without_extras(tmp_path, *args)
    assert result.returncode == 2
    assert f"needs the '{extra}' extra" in result.stderr and f"pip install 'retool[{extra}]'" in result.stderr
    assert "Traceback" not in result.stderr
