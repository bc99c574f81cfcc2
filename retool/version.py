"""The version people quote when they report a bug: the installed distribution's, else the checkout's.

The images and ``make install`` install the ``retool`` distribution, so its metadata is the truth;
a checkout run with ``python -m retool.cli`` and no install reads ``pyproject.toml`` beside it.
"""

from __future__ import annotations

import platform
import re
from pathlib import Path


def retool_version() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version("retool")
    except importlib.metadata.PackageNotFoundError:
        pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
        found = re.search(r'^version = "([^"]+)"', pyproject.read_text(), re.MULTILINE) if pyproject.is_file() else None
        return found.group(1) if found else "unknown"


def version_line() -> str:
    """``retool 0.1.0 (Python 3.11.9, Linux x86_64)``: what ``retool --version`` prints and a bug report needs."""
    return f"retool {retool_version()} (Python {platform.python_version()}, {platform.system()} {platform.machine()})"
