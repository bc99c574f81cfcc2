"""``retool --help`` is where a newcomer looks for a command: every command that has actions names them there.

`make demo`'s headline step is ``retool data check``, and ``retool --help`` used to say of ``data``
only "prepare SFT, RL and evaluation data" (issue 50, item 6).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

from retool.cli import build_parser
from tests.conftest import repo_env


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.update(action.choices)
    return found


def test_the_top_help_names_every_action_of_every_command(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "retool.cli", "--help"], cwd=tmp_path, env=repo_env(), capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())  # argparse folds the help lines
    missing = []
    for command, parser in _subcommands(build_parser()).items():
        for action in _subcommands(parser):
            if not re.search(rf"\b{re.escape(command)} {re.escape(action)}\b", text):
                missing.append(f"{command} {action}")
    assert not missing, f"`retool --help` does not name: {', '.join(missing)}\n{proc.stdout}"
