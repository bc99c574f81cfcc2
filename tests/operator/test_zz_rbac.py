"""RBAC, the other direction: every rule in permissions.RULES was requested by the operator.

The integration modules record every request the operator makes (their ``cluster`` fixture also
checks each one is granted); this module is named to run after them and checks that nothing is
granted that none of them requested, except what is needed without being a request of ours
(``NOT_REQUESTED``). It needs the requests of every integration test, so all of them must run in
this process before it: tests/conftest.py ``SAME_WORKER`` keeps the group on one pytest-xdist
worker, in order. A group split across workers (or run out of order) fails; a session that
selected only part of the group (``pytest tests/operator/test_zz_rbac.py``, ``-m "not slow"``,
``-k``) skips, saying how to run it.
"""

from __future__ import annotations

import re

import pytest

from retool_operator.permissions import NOT_REQUESTED, RULES
from tests.conftest import REPO, SAME_WORKER
from tests.operator.test_integration import USED, USED_BY

OPERATOR_TESTS = REPO / "tests" / "operator"
THIS = "tests/operator/test_zz_rbac.py"


def recording_modules() -> set[str]:
    """The test files whose tests record the operator's requests: test_integration.py, which defines
    the ``cluster`` fixture, and every file that imports it from there (found by reading them, so a
    new or renamed one cannot be left out of the group)."""
    importer = re.compile(r"^from tests\.operator\.test_integration import .*\bcluster\b", re.M)
    found = {"tests/operator/test_integration.py"}
    for path in OPERATOR_TESTS.glob("test_*.py"):
        if importer.search(path.read_text()):
            found.add(path.relative_to(REPO).as_posix())
    return found


def test_the_recording_modules_and_this_one_are_one_worker_group() -> None:
    group = {path for path, name in SAME_WORKER.items() if name == SAME_WORKER.get(THIS)}
    assert THIS in SAME_WORKER, "test_zz_rbac is not in tests/conftest.py SAME_WORKER"
    assert group == recording_modules() | {THIS}, "tests/conftest.py SAME_WORKER must hold exactly the modules that use the recording cluster fixture, and this one"
    assert all((REPO / path).is_file() for path in group), f"SAME_WORKER names files that do not exist: {sorted(p for p in group if not (REPO / p).is_file())}"
    assert sorted(group)[-1] == THIS, "this module must sort last in its group: it runs after the modules it checks"


def test_rbac_grants_nothing_the_operator_does_not_use(request: pytest.FixtureRequest) -> None:
    modules = recording_modules()
    selected = [item for item in request.session.items if item.nodeid.split("::", 1)[0] in modules]
    left_out = sorted(modules - {item.nodeid.split("::", 1)[0] for item in selected})
    if left_out or request.config.getoption("keyword"):
        # The session's own selection, not a missing file: the group test above catches renames.
        pytest.skip(f"this session selected only part of the group ({'-k' if not left_out else 'not ' + ', '.join(left_out)}); run: pytest {' '.join(sorted(modules | {THIS}))}")
    recording = {item.nodeid for item in selected if "cluster" in getattr(item, "fixturenames", ())}
    missing = sorted(recording - USED_BY)
    assert not missing, (
        f"{len(missing)} integration test(s) of this session did not record their requests in this process before this test"
        f" (the group was split across workers or ran out of order; see tests/conftest.py SAME_WORKER): {missing[:5]}"
    )
    granted = {(g, r, v) for rule in RULES for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    unused = sorted(granted - USED - set(NOT_REQUESTED))
    assert unused == [], f"permissions.RULES grants what the operator never requested: {unused}"
    assert set(NOT_REQUESTED) <= granted
