"""StageCommand and the Hydra value grammar: what is rendered is what runs."""

from __future__ import annotations

import shlex

import pytest

from retool.recipe.render.command import LATEST, StageCommand, hydra_overrides, hydra_value
from retool.recipe.render.stages import enabled_stages, render_stage
from tests.render.cases import VARIANTS, context_of, run_of
from tests.render.verl_config import compose_verl


@pytest.mark.parametrize(
    ("value", "rendered"),
    [
        pytest.param(True, "True", id="bool-true"),
        pytest.param(False, "False", id="bool-false"),
        pytest.param(None, "null", id="none-is-null"),
        pytest.param(8, "8", id="int"),
        pytest.param(1e-6, "1e-06", id="float-exponent"),
        pytest.param(0.28, "0.28", id="float"),
        pytest.param("/data/ns/run/data/rl/train.parquet", "/data/ns/run/data/rl/train.parquet", id="absolute-path-bare"),
        pytest.param("pkg://retool.recipe.verl_plugins.dataset", "pkg://retool.recipe.verl_plugins.dataset", id="pkg-uri-bare"),
        pytest.param("true", '"true"', id="string-that-looks-like-bool-is-quoted"),
        pytest.param("1", '"1"', id="string-that-looks-like-int-is-quoted"),
        pytest.param("retool/qwen 32b", '"retool/qwen 32b"', id="space-is-quoted"),
        pytest.param('say "hi"', '"say \\"hi\\""', id="double-quote-escaped"),
        pytest.param(["console", "mlflow"], '["console","mlflow"]', id="list-of-strings"),
    ],
)
def test_hydra_value(value: object, rendered: str) -> None:
    assert hydra_value(value) == rendered


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("true", id="bool-word"),
        pytest.param("1e-5", id="exponent-word"),
        pytest.param("<operator default>", id="angle-brackets-and-space"),
        pytest.param("a,b=c", id="comma-and-equals"),
        pytest.param("it's \\ odd", id="quote-and-backslash"),
        pytest.param("${oc.env:HOME}", id="interpolation-is-not-resolved"),
        pytest.param("http://host.ns.svc:8080/x?y=1", id="url-with-query"),
    ],
)
def test_awkward_strings_survive_hydra_as_strings(value: str) -> None:
    cfg = compose_verl("ppo_trainer", hydra_overrides({"trainer.experiment_name": value}))
    assert cfg.trainer.experiment_name == value


def test_unrenderable_value_is_a_clear_error() -> None:
    with pytest.raises(TypeError, match="cannot render dict"):
        hydra_value({"a": 1})


STAGE_CASES = [pytest.param(v, s, id=f"{v}-{s}") for v in VARIANTS for s in enabled_stages(run_of(v))]


@pytest.mark.parametrize(("variant", "stage"), STAGE_CASES)
def test_shell_rendering_parses_back_to_the_exact_argv(variant: str, stage: str) -> None:
    run = run_of(variant)
    command = render_stage(run, stage, context_of(run))
    lines = command.shell().replace("\\\n", " ").splitlines()
    exports = [line for line in lines if line.startswith("export ")]
    commands = [shlex.split(line) for line in lines if not line.startswith("export ")]
    assert commands == [list(step) for step in command.steps()]
    assert dict(shlex.split(line)[1].split("=", 1) for line in exports) == dict(command.env)


def test_latest_step_is_substituted_everywhere_and_only_there() -> None:
    command = StageCommand(stage="eval", argv=("x", f"/c/global_step_{LATEST}"), pre=(("m", f"--local_dir=/c/global_step_{LATEST}/actor"),))
    assert command.needs_latest_step
    resolved = command.with_latest_step(120)
    assert resolved.argv == ("x", "/c/global_step_120")
    assert resolved.pre == (("m", "--local_dir=/c/global_step_120/actor"),)
    assert not resolved.needs_latest_step
    with pytest.raises(ValueError, match="non-negative"):
        command.with_latest_step(-1)


def test_stage_command_is_immutable() -> None:
    command = StageCommand(stage="rl", argv=["a"], env={"K": "V"})
    assert command.argv == ("a",)
    with pytest.raises(TypeError, match="does not support item assignment"):
        command.env["K"] = "other"  # type: ignore[index]


def test_script_writes_the_files_and_runs_the_command(tmp_path) -> None:
    """What `retool render` prints is a runnable script: heredocs reproduce the files byte for byte."""
    import subprocess

    target = tmp_path / "stages" / "rl-1" / "tool_config.yaml"
    content = "tools:\n- note: a line that says EOF\nEOF\n  x: '$HOME `id`'\n"
    command = StageCommand(stage="rl", argv=("sh", "-c", 'printf "%s" "$GREETING" > "$0"', str(tmp_path / "ran")), env={"GREETING": "hi there"}, files={str(target): content})
    subprocess.run(["sh", "-e", "-c", command.script()], check=True, timeout=30)
    assert target.read_text() == content
    assert (tmp_path / "ran").read_text() == "hi there"
