"""Run a preflight and deliver its verdict: report files, log lines, MLflow, the pod's termination message.

Shared by the stage entry (``python3 -m retool.preflight``) and ``retool preflight``; both hand over
a plan and options and exit with :attr:`Report.exit_code`.
"""

from __future__ import annotations

import logging

from retool.preflight.plan import Plan, PreflightOptions
from retool.preflight.report import Report, summary_lines, write_report, write_termination_message

logger = logging.getLogger("retool.preflight")


def execute(target: Plan, options: PreflightOptions, *, tracking_uri: str | None = None, run_id: str | None = None) -> Report:
    if target.run.spec.trainer.verl == "0.9.1":  # verl 0.9.1's code: the checks ported to that line
        from retool.preflight.line09 import run_preflight
    else:
        from retool.preflight.runner import run_preflight

    report = run_preflight(target, options)
    files = write_report(report, options.work_dir)
    for line in summary_lines(report.results):
        logger.info("%s", line)
    logger.info("report: %s", " and ".join(str(f) for f in files))
    if tracking_uri and run_id:
        from retool.preflight.tracking import log_safely

        log_safely(tracking_uri, run_id, report, files)
    if report.failure:
        logger.error("%s", report.failure)
        write_termination_message(report.failure)
    elif report.warnings:
        # read by the operator from the succeeded pod: the run's status, a condition and an Event
        logger.warning("%s", report.warnings)
        write_termination_message(report.warnings)
    return report
