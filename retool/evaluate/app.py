"""``retool eval`` as a library call: load problems, bring up the sandbox, run, summarise, log.

Bad input is rejected before anything starts; an embedded sandbox is stopped however the run
ends. The summary is written next to the results and, with a tracking URI, logged to MLflow
with the results file as an artifact.
"""

from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

from retool.embedded.servers import sandbox_server
from retool.evaluate.chat import ChatClient, Sampling
from retool.evaluate.mlflow_log import LoggedRun, log_run
from retool.evaluate.problems import load_problems
from retool.evaluate.results import SampleResult, summarize
from retool.evaluate.runner import evaluate
from retool.evaluate.tools import DEFAULT_MAX_OUTPUT_CHARS, sandbox_tool, training_tool_schema
from retool.recipe.reward.score import compute_score
from retool.recipe.reward.symbolic import warm_default_pool
from retool.tracking.evaluation import log_eval_results

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EvalConfig:
    endpoint: str
    model: str
    data: Path
    n: int = 1
    max_turns: int = 8
    max_parallel_calls: int = 1
    concurrency: int = 16
    temperature: float = 1.0
    top_p: float = 0.6
    max_tokens: int | None = None
    seed: int | None = None
    request_timeout_s: float = 600.0
    api_key: str | None = None
    limit: int | None = None
    sandbox_url: str | None = None
    sandbox_workers: int = 4
    run_timeout_s: float = 30.0
    memory_limit_mb: int = 1024
    max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS
    out: Path = Path("build/eval/results.jsonl")
    mlflow_uri: str | None = None
    experiment: str = "retool-eval"
    run_name: str | None = None
    log_dir: Path = Path("build/eval")

    def params(self) -> dict[str, str]:
        """What is logged as MLflow params (never the API key)."""
        hidden = {"api_key", "mlflow_uri", "log_dir", "out"}
        return {k: str(v) for k, v in asdict(self).items() if k not in hidden and v is not None}


@dataclass(frozen=True)
class EvalOutcome:
    results: list[SampleResult]
    summary: dict[str, float]
    results_path: Path
    summary_path: Path
    mlflow: LoggedRun | None


def tracking_row(result: SampleResult) -> dict[str, object]:
    """A per-sample row as the tracking helpers read them (uid per problem; the conversation left out)."""
    return {
        "uid": f"{result.data_source}/{result.problem_index}",
        "data_source": result.data_source,
        "sample": result.sample_index,
        "score": result.score,
        "acc": float(result.acc),
        "pred": result.pred or "",
        "ground_truth": result.ground_truth,
        "turns": result.turns,
        "tool_calls": result.tool_calls,
        "stop": result.stop,
    }


def summary_path_for(results_path: Path) -> Path:
    return results_path.with_name(results_path.name.removesuffix(".jsonl") + ".summary.json")


async def run_eval(config: EvalConfig, *, progress: bool = False) -> EvalOutcome:
    problems = load_problems(config.data, config.limit)
    warm_default_pool()  # the reward's symbolic workers start while the data loads and the sandbox starts, not at the first answer that needs them
    logger.info("%d problem(s) x %d sample(s) from %s", len(problems), config.n, config.data)
    with contextlib.ExitStack() as stack:
        sandbox_url = config.sandbox_url
        if sandbox_url is None:
            server = stack.enter_context(sandbox_server(config.log_dir, workers=config.sandbox_workers))
            sandbox_url = server.base_url
        bar = stack.enter_context(_progress_bar(len(problems) * config.n, enabled=progress))
        done, solved = 0, 0

        def on_sample(result: SampleResult) -> None:
            nonlocal done, solved
            done, solved = done + 1, solved + int(result.acc)
            bar.update(1)
            bar.set_postfix(acc=f"{solved / done:.3f}")

        chat = ChatClient(
            config.endpoint,
            config.model,
            api_key=config.api_key,
            sampling=Sampling(temperature=config.temperature, top_p=config.top_p, max_tokens=config.max_tokens, seed=config.seed),
            timeout_s=config.request_timeout_s,
            max_connections=config.concurrency,
        )
        try:
            async with sandbox_tool(
                sandbox_url,
                run_timeout_s=config.run_timeout_s,
                memory_limit_mb=config.memory_limit_mb,
                max_output_chars=config.max_output_chars,
                concurrency=config.concurrency,
            ) as tool:
                results = await evaluate(
                    problems,
                    n=config.n,
                    chat=chat,
                    execute=tool,
                    tools=[training_tool_schema()],
                    score=compute_score,
                    max_turns=config.max_turns,
                    max_parallel_calls=config.max_parallel_calls,
                    concurrency=config.concurrency,
                    out=config.out,
                    on_sample=on_sample,
                )
        finally:
            await chat.aclose()
    summary = summarize(results)
    summary_path = summary_path_for(config.out)
    summary_path.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    logged = None
    if config.mlflow_uri:
        logged = log_run(
            config.mlflow_uri,
            config.experiment,
            run_name=config.run_name or f"{config.model}-{config.data.stem}",
            params=config.params(),
            metrics=summary,
            artifacts=[config.out, summary_path],
            tags={"retool.kind": "eval", "retool.model": config.model},
            # The eval stage's layout too (eval/samples.jsonl, eval/results.json...), so tools that
            # read an eval stage's run (load_eval_results) read this one.
            also=lambda run_id: log_eval_results(config.mlflow_uri, run_id, [tracking_row(r) for r in results]),
        )
    return EvalOutcome(results=results, summary=summary, results_path=config.out, summary_path=summary_path, mlflow=logged)


def _progress_bar(total: int, *, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc="eval", unit="sample", disable=not enabled, dynamic_ncols=True)
