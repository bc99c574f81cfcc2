"""``python -m retool.stage STAGE [--spec FILE]``: what every stage pod runs.

The operator starts each stage (a Job or the RayJob's entrypoint) with this command and the
run's spec mounted at ``retool.runtime.context.SPEC_MOUNT_PATH``. It reads the stage context the
operator put in the environment, renders the stage's command (``retool.recipe.render.stages``), resolves
the latest checkpoint where the command needs one, writes the tool config and the rendered
command under the run's ``stages/<stage>-<attempt>/`` directory on the PVC, runs the command with
its output going straight to the pod's log, and exits with its status. An RL retry needs nothing
special: verl resumes from the latest checkpoint in the same directory (``resume_mode=auto``).
SFT is resolved against the prepared data (``retool.runtime.sft_plan``): the default save
frequency (one save per epoch) and, on a retry from an epoch-boundary checkpoint, a resume view
without verl's exhausted loader state (``retool.runtime.sft_resume``, verl issue #7401).

An exit status of 0 is not success by itself: the stage then checks that it did its work
(``retool.runtime.completion``: SFT and RL left the checkpoint of their planned last step, eval
scored every requested set) and otherwise exits ``EXIT_INCOMPLETE`` with the reason.
Around the command, ``retool.stage_hooks`` opens the attempt's MLflow run, mirrors outputs to S3,
and (eval) logs the results and registers the model.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml

from retool import stage_hooks
from retool.recipe.render.command import StageCommand
from retool.recipe.render.common import CPU_ONLY_MODULE, PYTHON, attempt_dir
from retool.recipe.render.sft import STEPS_PER_EPOCH
from retool.recipe.render.stages import RENDERERS, render_stage
from retool.runtime import completion, sft_resume
from retool.runtime.context import SPEC_MOUNT_PATH, StageContext
from retool.runtime.paths import run_paths
from retool.runtime.sft_plan import SFTPlan, parquet_rows, sft_plan
from retool.spec.model import RetoolRun
from retool.spec.validate import parse_run
from retool.storage.steps import latest_step

log = logging.getLogger("retool.stage")

EXIT_SETUP_FAILED = 2
"""Exit status when the stage could not start its command (bad spec, missing checkpoint, ...)."""
EXIT_INCOMPLETE = 3
"""Exit status when the command exited 0 without doing its work (see ``retool.runtime.completion``)."""


def resolve(command: StageCommand) -> StageCommand:
    """The command with its latest-checkpoint step filled in from the PVC."""
    if not command.needs_latest_step:
        return command
    if command.checkpoint_source is None:
        raise ValueError(f"the {command.stage} command needs a checkpoint step but names no checkpoint directory")
    directory, subdir = command.checkpoint_source
    step = latest_step(directory, subdir)
    log.info("latest checkpoint in %s: global_step_%d", directory, step)
    return command.with_latest_step(step)


def resume_view_root(run: RetoolRun, ctx: StageContext) -> str:
    return str(Path(attempt_dir(run_paths(run), "sft", ctx.attempt), "resume"))


def resolve_sft(run: RetoolRun, ctx: StageContext, command: StageCommand) -> tuple[StageCommand, SFTPlan, int | None]:
    """The SFT command with its plan applied: the save frequency, and the epoch-boundary resume guard.

    Returns (command, plan, step of the checkpoint that needs a resume view, or None).
    """
    train = run_paths(run).sft_train
    try:
        rows = parquet_rows(train)
    except FileNotFoundError:
        raise ValueError(f"the SFT data {train} does not exist: the prepare stage has not run") from None
    plan = sft_plan(run.spec, rows)
    log.info("SFT plan: %d rows, %d steps per epoch x %d epochs = %d steps, a checkpoint every %d", rows, plan.steps_per_epoch, plan.epochs, plan.total_steps, plan.save_freq)
    updates: dict[str, object] = {}
    if command.overrides.get("trainer.save_freq") == STEPS_PER_EPOCH:
        updates["trainer.save_freq"] = plan.save_freq
    step = sft_resume.boundary_step(run_paths(run).sft_checkpoints, plan)
    if step is not None:
        updates.update(sft_resume.resume_overrides(sft_resume.resume_view_path(resume_view_root(run, ctx), step)))
    return (command.with_overrides(updates) if updates else command), plan, step


def write_files(command: StageCommand, record: str) -> None:
    """The command's own files, plus the rendered command kept for people and for MLflow."""
    for path, content in command.files.items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(content, encoding="utf-8")
    Path(record).mkdir(parents=True, exist_ok=True)
    Path(record, "command.sh").write_text("#!/bin/sh\nset -e\n" + command.script() + "\n", encoding="utf-8")
    payload = {"stage": command.stage, "pre": [list(p) for p in command.pre], "argv": list(command.argv), "env": dict(command.env), "notes": list(command.notes)}
    Path(record, "command.json").write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")


def program(argv: Sequence[str]) -> list[str]:
    """``python3`` in a rendered command means the interpreter running this stage (the image's)."""
    return [sys.executable, *argv[1:]] if argv and argv[0] == PYTHON else list(argv)


def program_name(argv: Sequence[str]) -> str:
    """What a step runs, for the log: the module (through launchers such as ``retool.runtime.cpu_only``), else the program."""
    modules = [argv[i + 1] for i in range(len(argv) - 1) if argv[i] == "-m"]
    while len(modules) > 1 and modules[0] == CPU_ONLY_MODULE:
        modules.pop(0)
    return modules[0] if modules else argv[0]


def run_steps(command: StageCommand, base_env: Mapping[str, str]) -> int:
    """Run ``pre`` then ``argv``; stop at the first failure. Output is inherited (streams to the log).

    SIGTERM/SIGINT (pod deletion, suspend) are passed on to the running command so that it can
    stop cleanly within the pod's grace period.
    """
    env = {**base_env, **command.env}
    for argv in command.steps():
        log.info("running: %s", " ".join(argv[:6]) + (" ..." if len(argv) > 6 else ""))
        child = subprocess.Popen(program(argv), env=env)

        def forward(signum: int, _frame: object, child: subprocess.Popen = child) -> None:
            child.send_signal(signum)

        previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            status = child.wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if status != 0:
            log.error("%s exited with status %d", program_name(argv), status)
            return status if status > 0 else 128 - status
    return 0


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m retool.stage", description="Render and run one stage of a RetoolRun (used by the operator).")
    parser.add_argument("stage", choices=tuple(RENDERERS))
    parser.add_argument("--spec", default=SPEC_MOUNT_PATH, help=f"the RetoolRun YAML (default {SPEC_MOUNT_PATH})")
    parser.add_argument("--dry-run", action="store_true", help="render, resolve and print the command; run nothing, write nothing")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    environ = os.environ if environ is None else environ
    plan: SFTPlan | None = None
    boundary: int | None = None
    try:
        ctx = StageContext.from_env(environ)
        run = parse_run(yaml.safe_load(Path(args.spec).read_text(encoding="utf-8")))
        command = resolve(render_stage(run, args.stage, ctx, spec_file=args.spec))
        if args.stage == "sft":
            command, plan, boundary = resolve_sft(run, ctx, command)
        expected = completion.expectation(run, args.stage, plan)
    except (OSError, ValueError, yaml.YAMLError) as err:
        log.error("cannot start stage %s: %s", args.stage, err)
        return EXIT_SETUP_FAILED
    if args.dry_run:
        sys.stdout.write(command.script() + "\n")
        return 0
    if boundary is not None:
        sft_resume.make_resume_view(run_paths(run).sft_checkpoints, boundary, resume_view_root(run, ctx))
    command, tracked = stage_hooks.start(ctx, args.stage, command)
    write_files(command, attempt_dir(run_paths(run), args.stage, ctx.attempt))
    status = run_steps(command, environ)
    failure = None
    if status == 0:
        failure = completion.unmet(expected)
        if failure is not None:
            log.error("stage %s did not complete: %s", args.stage, failure)
            status = EXIT_INCOMPLETE
    return stage_hooks.finish(run, ctx, args.stage, tracked, status, failure=failure)


if __name__ == "__main__":
    sys.exit(main())
