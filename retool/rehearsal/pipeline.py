"""The training rehearsal: a RetoolRun that really trains, on this machine's CPU, through every stage's own command.

prepare -> preflight -> sft -> merge -> rl -> eval of a tiny Qwen2.5 (``retool.rehearsal.model``)
on the demo's rehearsal data, with our sandbox and an MLflow server. What it proves and what it
cannot: docs/rehearsal.md. ``make demo`` runs it after the demo's other steps; the tests run a
shorter one and cut each seam between the stages (tests/rehearsal).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import yaml
from tqdm import tqdm

from retool.recipe.render.stages import enabled_stages
from retool.rehearsal.model import TinyShape, build_tiny_model
from retool.rehearsal.runner import Attempt, Machine, run_attempt
from retool.rehearsal.spec import DEMO, MODEL_DIR, Size, claim_root, rehearsal_run, write_sources
from retool.runtime.context import StageContext
from retool.spec.model import RetoolRun
from retool.spec.validate import parse_run
from retool.tracking.naming import experiment_name
from retool.tracking.params import spec_params
from retool.tracking.runs import ParentRun, ensure_parent_run

logger = logging.getLogger(__name__)


class StageFailedError(RuntimeError):
    """A stage attempt exited non-zero: names the stage, its status and its log."""

    def __init__(self, attempt: Attempt) -> None:
        tail = attempt.log.read_text(encoding="utf-8", errors="replace").splitlines()[-15:] if attempt.log.exists() else []
        super().__init__(f"stage {attempt.stage} (attempt {attempt.attempt}) exited with status {attempt.status}; its log: {attempt.log}\n" + "\n".join(tail))
        self.attempt = attempt


@dataclass(frozen=True)
class RehearsalConfig:
    out: Path
    """Everything the rehearsal writes: the claim (``pvc/``), its sources, the spec, the stage logs."""
    python: Path
    """The trainer environment's interpreter (the 0.9 line's: ``.venv-verl09/bin/python``)."""
    sandbox_url: str
    mlflow_uri: str
    size: Size = DEMO
    shape: TinyShape = field(default_factory=TinyShape)
    progress: bool = True
    threads: int | None = None
    """torch's threads per training process (:attr:`Machine.threads`)."""


@dataclass
class Rehearsal:
    """One rehearsal run: set up once, then its stages run one attempt at a time (:meth:`run_stage`)."""

    config: RehearsalConfig
    spec_file: Path
    run: RetoolRun
    parent: ParentRun
    uid: str
    attempts: list[Attempt] = field(default_factory=list)

    @property
    def claim(self) -> Path:
        return claim_root(self.config.out)

    @property
    def logs(self) -> Path:
        return self.config.out / "logs"

    def context(self, attempt: int) -> StageContext:
        """What the operator puts in a stage pod's environment for this attempt."""
        return StageContext(
            run_name=self.run.metadata.name,
            namespace=self.run.metadata.namespace or "default",
            sandbox_url=self.config.sandbox_url,
            attempt=attempt,
            run_uid=self.uid,
            mlflow_tracking_uri=self.config.mlflow_uri,
            mlflow_experiment=self.experiment,
            mlflow_parent_run_id=self.parent.run_id,
        )

    @property
    def experiment(self) -> str:
        return experiment_name(self.run.metadata.namespace, self.run.metadata.name, self.run.spec.tracking.mlflow.experiment)

    def expected_steps(self, stage: str) -> int | None:
        spec = self.run.spec
        if stage == "sft":
            return spec.sft.epochs * _sft_rows(self.run) // spec.sft.batch_size
        if stage == "rl":
            return spec.rl.steps
        return None

    def run_stage(self, stage: str, attempt: int = 1, *, stop_when: Callable[[], bool] | None = None) -> Attempt:
        total = self.expected_steps(stage)
        # A stage without steps (prepare, preflight, merge, eval) shows its elapsed time only.
        bar_format = None if total else "{desc}: {elapsed}"
        with tqdm(total=total, desc=f"{stage} (attempt {attempt})", unit="step", bar_format=bar_format, disable=not self.config.progress, leave=True) as bar:

            def on_step(step: int) -> None:
                if total:
                    bar.n = min(step, total)
                    bar.refresh()

            machine = Machine(self.config.python, threads=self.config.threads)
            result = run_attempt(stage, self.context(attempt), self.spec_file, machine, self.logs, on_step=on_step, stop_when=stop_when)
            if result.status == 0 and total:
                bar.n = total
                bar.refresh()
        self.attempts.append(result)
        logger.info("%s attempt %d: status %d in %.1f s", stage, attempt, result.status, result.seconds)
        return result

    def run_all(self, stages: tuple[str, ...] | None = None) -> list[Attempt]:
        """Every enabled stage once, in order; :class:`StageFailedError` at the first that fails."""
        done = []
        for stage in stages or enabled_stages(self.run):
            attempt = self.run_stage(stage)
            if attempt.status != 0:
                raise StageFailedError(attempt)
            done.append(attempt)
        return done


def _sft_rows(run: RetoolRun) -> int:
    source = Path(run.spec.data.sft)
    return sum(1 for line in source.read_text(encoding="utf-8").splitlines() if line.strip())


def set_up(config: RehearsalConfig) -> Rehearsal:
    """The tiny model on the claim, the sources, the spec file and the MLflow parent run (as the operator makes it)."""
    out = config.out.resolve()
    claim = claim_root(out)
    model_dir = claim / MODEL_DIR
    if not (model_dir / "config.json").exists():
        build_tiny_model(model_dir, config.shape)
    data = write_sources(out / "sources")
    document = rehearsal_run(out, data, config.size)
    spec_file = out / "run.yaml"
    spec_file.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    run = parse_run(document)
    uid = str(uuid.uuid4())
    parent = ensure_parent_run(
        config.mlflow_uri,
        experiment=experiment_name(run.metadata.namespace, run.metadata.name, run.spec.tracking.mlflow.experiment),
        namespace=run.metadata.namespace,
        name=run.metadata.name,
        uid=uid,
        spec_params=spec_params(run),
    )
    return Rehearsal(config=replace(config, out=out), spec_file=spec_file, run=run, parent=parent, uid=uid)
