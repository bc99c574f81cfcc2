"""Every module, class and file a rendered stage names exists in this checkout.

verl imports our dataset class, reward file and tool class by name or path inside its own
processes, and the stage commands run ``python3 -m <module>``: a module moved without its path
following would only fail on a cluster, minutes into a stage. Here every variant's every stage is
rendered and each path it names is resolved the way its consumer resolves it.
"""

from __future__ import annotations

import importlib
import importlib.util
import itertools
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from retool.recipe import verl_plugins
from retool.recipe.render.stages import enabled_stages, render_stage
from tests.conftest import REPO
from tests.render.cases import VARIANTS, context_of, run_of

_MODULE = re.compile(r"^(retool|verl)(\.[A-Za-z_][A-Za-z0-9_]*)+$")


def _strings(value: object) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _strings(item)


def _named_paths(variant: str) -> Iterator[tuple[str, str, str]]:
    """(stage, kind, path) of every module (``-m``), pkg:// module, class and .py file a stage names."""
    run = run_of(variant)
    for stage in enabled_stages(run):
        command = render_stage(run, stage, context_of(run))
        for argv in (*command.pre, command.argv):
            for flag, arg in itertools.pairwise(argv):
                if flag == "-m":
                    yield stage, "module", arg
        for text in _strings(dict(command.overrides)):
            if text.startswith("pkg://"):
                yield stage, "module", text.removeprefix("pkg://")
            elif text.endswith(".py"):
                yield stage, "file", text
        for content in command.files.values():
            for tool in (yaml.safe_load(content) or {}).get("tools", []):
                yield stage, "class", tool["class_name"]


CASES = sorted({(variant, *named) for variant in VARIANTS for named in _named_paths(variant)})


@pytest.mark.parametrize(("variant", "stage", "kind", "path"), CASES, ids=[f"{v}-{s}-{k}-{p.rsplit('/', 1)[-1]}" for v, s, k, p in CASES])
def test_rendered_path_resolves(variant: str, stage: str, kind: str, path: str) -> None:
    if kind == "module":
        assert _MODULE.match(path), path
        assert importlib.util.find_spec(path) is not None, f"{variant}/{stage} runs module {path}, which does not exist"
    elif kind == "class":
        module, _, name = path.rpartition(".")
        assert hasattr(importlib.import_module(module), name), f"{variant}/{stage} names class {path}, which does not exist"
    else:
        file = Path(path)
        assert file.is_file(), f"{variant}/{stage} names file {path}, which does not exist"
        assert REPO in file.resolve().parents, f"{path} is not a file of this package"


def test_every_verl_plugin_is_rendered() -> None:
    """The three things verl loads of ours all appear in the rl stage of the reference run."""
    named = {path for _, _, path in _named_paths("qwen32b-h200")}
    assert {verl_plugins.DATASET_MODULE, verl_plugins.REWARD_FILE, verl_plugins.TOOL_CLASS} <= named


def test_multi_node_sft_names_the_torchrun_launcher() -> None:
    named = {path for stage, kind, path in _named_paths("qwen32b-two-nodes") if stage == "sft" and kind == "module"}
    assert "retool.runtime.ray_torchrun" in named
