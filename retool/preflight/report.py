"""The preflight's report: what was checked, what each check found, as JSON (machines) and Markdown (people).

Pure rendering plus one writer. The JSON is the complete record (every check's details); the
Markdown is what a person reads first in the MLflow UI or on the PVC: the verdict, then a table
of checks, then each check's findings.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from retool.preflight.checks import BY_NAME, CheckResult, exit_code, failure_message, warnings_message

REPORT_JSON = "preflight-report.json"
REPORT_MD = "preflight-report.md"
TERMINATION_LOG = "/dev/termination-log"
"""Kubernetes' default terminationMessagePath: its content becomes the container's termination
message in the pod status, where the operator can read why the preflight failed."""

_ICON = {"passed": "ok", "warning": "WARN", "failed": "FAIL", "skipped": "skip"}


@dataclass(frozen=True)
class Report:
    run: str
    namespace: str
    stages: tuple[str, ...]
    tokenizer: str
    recipe: str
    sandbox_url: str | None
    """None for a run without a sandbox (recipe text-only)."""
    results: tuple[CheckResult, ...]
    seconds: float
    facts: Mapping[str, Any] = field(default_factory=dict)
    """Run-level numbers worth a metric: SFT length percentiles, kept prompts, rollouts scored..."""

    @property
    def exit_code(self) -> int:
        return exit_code(self.results)

    @property
    def passed(self) -> bool:
        return self.exit_code == 0

    @property
    def failure(self) -> str | None:
        return failure_message(self.results)

    @property
    def warnings(self) -> str | None:
        """Every warning on one line when the preflight passed with warnings, else None."""
        return None if self.failure else warnings_message(self.results)

    def to_dict(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "namespace": self.namespace,
            "stages": list(self.stages),
            "tokenizer": self.tokenizer,
            "recipe": self.recipe,
            "sandbox_url": self.sandbox_url,
            "passed": self.passed,
            "exit_code": self.exit_code,
            "failure": self.failure,
            "seconds": round(self.seconds, 2),
            "facts": dict(self.facts),
            "checks": [{**asdict(r), "details": dict(r.details)} for r in self.results],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=str, ensure_ascii=False) + "\n"

    def to_markdown(self) -> str:
        verdict = "passed" if self.passed else f"FAILED (exit {self.exit_code}): {self.failure}"
        sandbox = f"sandbox {self.sandbox_url}" if self.sandbox_url else "no sandbox"
        lines = [
            f"# Preflight of {self.namespace}/{self.run}: {verdict}",
            "",
            f"Stages checked: {', '.join(self.stages) or 'none'}; recipe {self.recipe}; tokenizer `{self.tokenizer}`; {sandbox}; {self.seconds:.1f} s.",
            "",
            "| check | scope | result | summary |",
            "|---|---|---|---|",
        ]
        lines += [f"| {r.check} | {r.scope} | {_ICON[r.status]} | {_cell(r.summary)} |" for r in self.results]
        if self.facts:
            lines += ["", "## Figures", "", *(f"- {key}: {_value(value)}" for key, value in self.facts.items())]
        for result in self.results:
            if not result.details:
                continue
            lines += ["", f"## {result.label}: {result.status}", "", f"{BY_NAME[result.check].what[:1].upper()}{BY_NAME[result.check].what[1:]}.", "", result.summary, ""]
            lines += [f"- {key}: {_value(value)}" for key, value in result.details.items()]
        return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)) and len(value) > 8:
        return json.dumps(list(value[:8]), default=str, ensure_ascii=False)[:-1] + f", ... ({len(value)} in all)]"
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, default=str, ensure_ascii=False)
    return str(value)


def write_report(report: Report, directory: Path) -> tuple[Path, Path]:
    """``preflight-report.json`` and ``.md`` in ``directory`` (created); returns both paths."""
    directory.mkdir(parents=True, exist_ok=True)
    json_path, md_path = directory / REPORT_JSON, directory / REPORT_MD
    json_path.write_text(report.to_json(), encoding="utf-8")
    md_path.write_text(report.to_markdown(), encoding="utf-8")
    return json_path, md_path


def write_termination_message(message: str, path: str = TERMINATION_LOG) -> bool:
    """Leave ``message`` where Kubernetes reads a container's termination message; False outside a pod.

    Only an existing file is written (the kubelet creates it in every container): on a workstation
    ``/dev/termination-log`` does not exist and nothing is created.
    """
    if not os.path.exists(path):
        return False
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(message[:4000])  # the kubelet keeps at most 4096 bytes
    except OSError:
        return False
    return True


def summary_lines(results: Sequence[CheckResult]) -> list[str]:
    """One line per check, for the log."""
    return [f"{_ICON[r.status]:>4}  {r.label}: {r.summary}" for r in results]
