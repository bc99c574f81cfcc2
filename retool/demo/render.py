"""Render a RetoolRun into files a newcomer can read: the Kubernetes objects and each stage's command.

The manifests come from the operator's own builders (``retool render --manifests``), the
commands from the stage renderers the stage pods run (``retool render``), so what the demo shows
is what a cluster would get.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml


@dataclass(frozen=True)
class RenderedRun:
    manifests: Path
    commands: dict[str, Path]
    kinds: list[str]


def stage_script(stage: str, command) -> str:
    """A readable shell script of one stage: notes, then the files it writes and its command
    (``StageCommand.script()``, what ``retool render`` prints)."""
    lines = [f"# stage {stage}: the command its Job/RayJob runs (rendered by retool.recipe.render.stages)"]
    lines += [f"# note: {note}" for note in command.notes]
    lines.append(command.script())
    return "\n".join(lines) + "\n"


def render_run(example: Path, out_dir: Path, on_file: Callable[[Path], None] | None = None) -> RenderedRun:
    """Write ``manifests.yaml`` and ``commands/<stage>.sh`` for the RetoolRun in ``example``."""
    from retool.cli.render import load, placeholder_context
    from retool.recipe.render.stages import enabled_stages, render_stage
    from retool_operator.render import render_manifests

    out_dir.mkdir(parents=True, exist_ok=True)
    document = yaml.safe_load(example.read_text())
    manifests = out_dir / "manifests.yaml"
    text = render_manifests(document)
    manifests.write_text(text)
    if on_file:
        on_file(manifests)
    run = load(str(example))
    context = placeholder_context(run)
    commands_dir = out_dir / "commands"
    commands_dir.mkdir(exist_ok=True)
    commands = {}
    for stage in enabled_stages(run):
        path = commands_dir / f"{stage}.sh"
        path.write_text(stage_script(stage, render_stage(run, stage, context)))
        commands[stage] = path
        if on_file:
            on_file(path)
    kinds = [d["kind"] for d in yaml.safe_load_all(text) if d]
    return RenderedRun(manifests=manifests, commands=commands, kinds=kinds)
