"""The suite's own rules (docs/development.md, "Mutation check"): whatever the dev install provides is
imported, so a missing or renamed dependency fails the suite instead of skipping a whole file."""

from __future__ import annotations

import ast

from tests.conftest import REPO


def _importorskip_calls() -> list[str]:
    found = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "importorskip":
                found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    return found


def test_no_test_skips_on_a_missing_module() -> None:
    assert _importorskip_calls() == [], "import the module: every test dependency is declared in pyproject's dev extra"
