"""`make mutation-check` stays runnable: every row's line is still in its file, once, and the tests
that should catch it exist. The check itself takes minutes and is not part of `make test`; a stale
row found only when someone runs it would hide a bug the docs promise to rule out."""

from __future__ import annotations

import pytest

from tests.conftest import REPO
from tests.mutation_check import MUTATIONS


@pytest.mark.parametrize("mutation", MUTATIONS, ids=[m.name for m in MUTATIONS])
def test_each_mutation_names_a_line_that_is_there_once_and_tests_that_exist(mutation) -> None:
    text = (REPO / mutation.file).read_text()
    assert text.count(mutation.original) == 1, f"{mutation.file}: the line is gone or not unique: update the row with the code"
    assert mutation.mutated != mutation.original
    for target in mutation.tests:
        assert (REPO / target.split("::", 1)[0]).is_file(), target
