"""What the commands that run model code in a sandbox share (``retool eval``, ``retool data check``).

Both use the sandbox at ``--sandbox-url``, else start one on 127.0.0.1 (``retool.embedded``), run
code under the same per-execution limits, and read a problem/trajectory file whose unreadable
rows end the command with exit status 2.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def add_sandbox_arguments(parser: argparse.ArgumentParser, *, per: str, log_dir: Path) -> None:
    """The sandbox's flags; ``per`` names one execution in the help (``code block``), ``log_dir`` is the default of ``--log-dir``."""
    parser.add_argument("--sandbox-url", default=None, help="running sandbox (SandboxFusion API); default: start an embedded one on 127.0.0.1")
    parser.add_argument("--sandbox-workers", type=int, default=4, help="workers of the embedded sandbox; default 4")
    parser.add_argument("--run-timeout", type=float, default=30.0, help=f"seconds per {per}; default 30")
    parser.add_argument("--memory-limit-mb", type=int, default=1024, help=f"memory per {per}; default 1024")
    parser.add_argument("--log-dir", type=Path, default=log_dir, help="logs of the embedded sandbox")


def sandbox_config(args: argparse.Namespace) -> dict[str, Any]:
    """The config fields (of ``CheckConfig`` and ``EvalConfig``) that the flags of ``add_sandbox_arguments`` set."""
    return {
        "sandbox_url": args.sandbox_url,
        "sandbox_workers": args.sandbox_workers,
        "run_timeout_s": args.run_timeout,
        "memory_limit_mb": args.memory_limit_mb,
        "log_dir": args.log_dir,
    }


def run_reading_file(command: str, main: Coroutine[Any, Any, T]) -> T | None:
    """``asyncio.run(main)``; None once a file that cannot be read (``ProblemFileError``) is reported as ``command: why``."""
    from retool.evaluate.problems import ProblemFileError

    try:
        return asyncio.run(main)
    except ProblemFileError as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return None
