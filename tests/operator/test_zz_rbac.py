"""RBAC, the other direction: every rule in permissions.RULES was requested by the operator.

The integration modules record every request the operator makes (their ``cluster`` fixture also
checks each one is granted); this module is named to run after them and checks that nothing is
granted that none of them requested, except what is needed without being a request of ours
(``NOT_REQUESTED``). It needs every integration module's requests, so it skips when run alone.
"""

from __future__ import annotations

import pytest
from retool_operator.permissions import NOT_REQUESTED, RULES

from tests.operator.test_integration import USED, USED_BY

INTEGRATION_MODULES = frozenset({"test_integration", "test_integration_cluster", "test_integration_isolation", "test_integration_tracking", "test_preflight_stage"})
"""tests/conftest.py SAME_WORKER keeps them in one process under pytest-xdist."""


def test_rbac_grants_nothing_the_operator_does_not_use() -> None:
    if not INTEGRATION_MODULES <= USED_BY:
        pytest.skip(f"needs the requests of every integration module in the same session; recorded: {sorted(USED_BY)}")
    granted = {(g, r, v) for rule in RULES for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    unused = sorted(granted - USED - set(NOT_REQUESTED))
    assert unused == [], f"permissions.RULES grants what the operator never requested: {unused}"
    assert set(NOT_REQUESTED) <= granted
