"""docs/api/retoolrun.md is generated from the model and lists every field with its type, default, bounds and description."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel

from retool.spec.apidoc import render_api_reference
from retool.spec.model import RetoolRunSpec
from retool.spec.status import RetoolRunStatus
from retool.spec.validate import _unwrap
from tests.conftest import REPO

PAGE = REPO / "docs" / "api" / "retoolrun.md"


def test_checked_in_reference_matches_the_model() -> None:
    assert PAGE.read_text() == render_api_reference(), "docs/api/retoolrun.md drifted from retool/spec/model.py: run `make api-docs`"


def fields(model: type[BaseModel], path: str) -> list[tuple[str, str, Any]]:
    """(section, field alias, pydantic field) of every field reachable from ``model``."""
    out = []
    for name, field in model.model_fields.items():
        alias = field.alias or name
        out.append((path, alias, field))
        nested = _unwrap(field.annotation)
        if isinstance(nested, type) and issubclass(nested, BaseModel):
            is_list = "list[" in str(field.annotation)
            out += fields(nested, f"{path}.{alias}" + ("[]" if is_list else ""))
    return out


def sections(text: str) -> dict[str, str]:
    parts = re.split(r"^### (\S+)\n", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_every_field_is_documented_in_its_section_with_its_description_and_default() -> None:
    page = sections(PAGE.read_text())
    for model, root in ((RetoolRunSpec, "spec"), (RetoolRunStatus, "status")):
        for section, alias, field in fields(model, root):
            assert section in page, f"no section {section}"
            row = next((line for line in page[section].splitlines() if line.startswith(f"| `{alias}`")), None)
            assert row is not None, f"{section}.{alias} is not in the reference"
            assert (field.description or "").split(".")[0].replace("|", "\\|") in row, f"{section}.{alias}: description"


def test_defaults_and_bounds_are_shown() -> None:
    page = sections(PAGE.read_text())
    assert "| `nodes` | integer | `1` | >= 1; <= 64 |" in page["spec.hardware"]
    assert "| `learningRate` | number | `1e-06` | > 0; < 1 |" in page["spec.rl"]
    assert "| `retain` | one of `keep`, `delete` | `\"keep\"` |" in page["spec.storage"]
    assert "quantity (integer or string)" in page["spec.storage.pvc"]
