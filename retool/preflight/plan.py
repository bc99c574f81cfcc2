"""What a preflight checks (the rendered commands of a run's sft, rl and eval stages) and how.

Light on purpose (no verl import): the CLI and the stage entry build these before the checks load
the training stack. Tests build a plan and change one rendered command to break it the way a bad
renderer or a bad spec would.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from retool.data.schema import agent_name_for
from retool.recipe.render.command import StageCommand
from retool.recipe.render.ppo import uses_tools
from retool.recipe.render.stages import enabled_stages, render_stage
from retool.runtime.context import StageContext
from retool.spec.model import RetoolRun

PPO_STAGES = ("rl", "eval")
CHECKED_STAGES = ("sft", *PPO_STAGES)


@dataclass(frozen=True)
class PreflightOptions:
    tokenizer: str
    """A directory with the model's tokenizer files (or a hub id: only tokenizer files are fetched)."""
    work_dir: Path
    """The report, and scratch files (tool config copies, scripted episodes, validation dumps)."""
    sft_sample: int = 48
    """SFT rows checked token by token (a quarter of them, at most 16, the longest)."""
    max_truncated_fraction: float = 0.05
    """Largest share of SFT trajectories longer than sft.maxLength before the check fails."""
    sandbox_wait_s: float = 90.0
    """How long the sandbox may take to answer its first ping (its pods may still be starting)."""


@dataclass(frozen=True)
class Plan:
    run: RetoolRun
    ctx: StageContext
    commands: Mapping[str, StageCommand]
    """The rendered sft, rl and eval commands of the stages this run executes."""

    @property
    def agent(self) -> str:
        """The agent loop of the run's rollouts, which its prepared rows name (``spec.recipe`` decides)."""
        return agent_name_for(self.run.spec.recipe)

    @property
    def uses_tools(self) -> bool:
        """ReTool's rollouts call the code interpreter in the run's sandbox; the text-only baseline's
        run verl's ``single_turn_agent``, with no tool and no sandbox."""
        return uses_tools(self.run)


def plan(run: RetoolRun, ctx: StageContext) -> Plan:
    stages = enabled_stages(run)
    return Plan(run=run, ctx=ctx, commands={stage: render_stage(run, stage, ctx) for stage in CHECKED_STAGES if stage in stages})
