"""``retool data check`` as a library call: read a file, run the check, write the report, log it.

Rows that are not trajectories are reported (with the reason), not dropped silently; a file
that cannot be read at all is an error before any server starts.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

from retool.data_check.check import CheckReport, check_trajectories
from retool.data_check.report import write_report
from retool.data_check.trajectories import Trajectory, TrajectoryError, parse_trajectory
from retool.embedded.servers import sandbox_server
from retool.evaluate.mlflow_log import LoggedRun, log_run
from retool.evaluate.problems import ProblemFileError, read_rows
from retool.evaluate.tools import sandbox_tool
from retool.recipe.reward.score import compute_score, extract_answer
from retool.recipe.reward.symbolic import warm_default_pool

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CheckConfig:
    file: Path
    out_dir: Path = Path("data-check")
    sandbox_url: str | None = None
    sandbox_workers: int = 4
    concurrency: int = 8
    run_timeout_s: float = 30.0
    memory_limit_mb: int = 1024
    data_source: str = "retool_sft"
    limit: int | None = None
    mlflow_uri: str | None = None
    experiment: str = "retool-data-check"
    run_name: str | None = None
    log_dir: Path = Path("build/data-check")

    def params(self) -> dict[str, str]:
        hidden = {"mlflow_uri", "log_dir", "out_dir", "sandbox_url"}
        return {k: str(v) for k, v in asdict(self).items() if k not in hidden and v is not None}


@dataclass(frozen=True)
class CheckOutcome:
    report: CheckReport
    json_path: Path
    markdown_path: Path
    mlflow: LoggedRun | None


def load_trajectories(path: Path, limit: int | None = None) -> tuple[list[Trajectory], list[str]]:
    """Parsed trajectories and one line per unreadable row; ProblemFileError for a file without rows
    (nothing checked is not a check that passed)."""
    rows = read_rows(path)
    if not rows:
        raise ProblemFileError(f"{path}: no rows")
    if limit is not None:
        rows = rows[:limit]
    trajectories, unreadable = [], []
    for index, row in enumerate(rows):
        try:
            trajectories.append(parse_trajectory(row, index))
        except TrajectoryError as exc:
            unreadable.append(str(exc))
    return trajectories, unreadable


async def run_check(config: CheckConfig, *, progress: bool = False, label: str = "data check") -> CheckOutcome:
    trajectories, unreadable = load_trajectories(config.file, config.limit)
    warm_default_pool()  # the reward's symbolic workers start while the data loads and the sandbox starts, not at the first answer that needs them
    blocks = sum(len(t.steps) for t in trajectories)
    logger.info("%d trajectories, %d code blocks, %d unreadable rows in %s", len(trajectories), blocks, len(unreadable), config.file)
    from tqdm import tqdm

    with contextlib.ExitStack() as stack:
        sandbox_url = config.sandbox_url
        if sandbox_url is None:
            sandbox_url = stack.enter_context(sandbox_server(config.log_dir, workers=config.sandbox_workers)).base_url
        bar = stack.enter_context(tqdm(total=blocks, desc=label, unit="block", disable=not progress, dynamic_ncols=True))
        async with sandbox_tool(sandbox_url, run_timeout_s=config.run_timeout_s, memory_limit_mb=config.memory_limit_mb, concurrency=config.concurrency) as tool:
            report = await check_trajectories(
                trajectories,
                run_code=tool.run,
                score=compute_score,
                extract=extract_answer,
                data_source=config.data_source,
                concurrency=config.concurrency,
                on_block=lambda: bar.update(1),
                source=str(config.file),
            )
    report.unreadable = unreadable
    json_path, markdown_path = write_report(report, config.out_dir)
    logged = None
    if config.mlflow_uri:
        logged = log_run(
            config.mlflow_uri,
            config.experiment,
            run_name=config.run_name or f"data-check-{config.file.stem}",
            params=config.params(),
            metrics=report.metrics(),
            artifacts=[json_path, markdown_path],
            tags={"retool.kind": "data-check", "retool.ok": str(report.ok).lower()},
        )
    return CheckOutcome(report=report, json_path=json_path, markdown_path=markdown_path, mlflow=logged)
