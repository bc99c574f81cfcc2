"""The preflight stage's command, rendered like every other stage's (pure: no verl, no filesystem).

``python3 -m retool.stage preflight`` renders this and runs it like any stage command: the stage
entry opens the attempt's MLflow run (its ``MLFLOW_RUN_ID`` reaches the preflight, which logs its
report there), writes ``command.sh`` beside the report in ``stages/preflight-<attempt>/`` and
exits with the preflight's status.
"""

from __future__ import annotations

from retool.recipe.render.command import StageCommand
from retool.recipe.render.common import CPU_ONLY_MODULE, PYTHON, attempt_dir, cpu_stage_env
from retool.runtime.context import StageContext
from retool.runtime.paths import run_paths, staged_model_path
from retool.spec.model import RetoolRun

MODULE = "retool.preflight"
STAGE = "preflight"

# A CPU pod: beyond the CPU stages' environment (no accelerator backend autoload, caches on the
# PVC, the hub offline: the tokenizer comes from the staged model), no device is visible.
EXTRA_ENV = {"CUDA_VISIBLE_DEVICES": ""}


def tokenizer_source(run: RetoolRun) -> str:
    """Where the preflight reads the tokenizer: the model the prepare stage staged onto the PVC
    (only its tokenizer files are read), the same copy every later stage loads."""
    return staged_model_path(run)


def render_preflight(run: RetoolRun, ctx: StageContext, spec_file: str) -> StageCommand:
    report_dir = attempt_dir(run_paths(run), STAGE, ctx.attempt)
    # retool.runtime.cpu_only: the pod has no NPU (no driver) and transformers/accelerate import
    # torch_npu whenever it is installed (TORCH_DEVICE_BACKEND_AUTOLOAD=0 stops only torch's autoload).
    argv = (PYTHON, "-m", CPU_ONLY_MODULE, "-m", MODULE, "--spec", spec_file, "--tokenizer", tokenizer_source(run), "--report-dir", report_dir)
    notes = (f"checks the run's data, tokenizer, tool, reward and sandbox through verl's runtime code on CPU; report in {report_dir}",)
    return StageCommand(stage=STAGE, argv=argv, env={**cpu_stage_env(run), **EXTRA_ENV}, notes=notes)
