"""status.observedAt: when the operator last looked, refreshed while a run is unfinished so a stale status shows."""

from __future__ import annotations

import datetime as dt

import pytest

from retool_operator.status import OBSERVED_HEARTBEAT_SECONDS, status_to_write

T = dt.datetime(2026, 12, 2, 12, 0, tzinfo=dt.UTC)
STAMP = "2026-12-02T12:00:00Z"


def later(seconds: float) -> dt.datetime:
    return T + dt.timedelta(seconds=seconds)


@pytest.mark.parametrize(
    ("old", "new", "now", "written"),
    [
        ({}, {"phase": "Pending"}, T, True),
        ({"phase": "RL", "observedAt": STAMP}, {"phase": "RL", "observedAt": STAMP}, later(OBSERVED_HEARTBEAT_SECONDS - 1), False),
        ({"phase": "RL", "observedAt": STAMP}, {"phase": "RL", "observedAt": STAMP}, later(OBSERVED_HEARTBEAT_SECONDS), True),
        ({"phase": "RL"}, {"phase": "RL"}, T, True),
        ({"phase": "RL", "observedAt": STAMP}, {"phase": "RL", "message": "stage rl started", "observedAt": STAMP}, later(1), True),
        ({"phase": "Succeeded", "observedAt": STAMP}, {"phase": "Succeeded", "observedAt": STAMP}, later(86400), False),
        ({"phase": "Failed"}, {"phase": "Failed"}, later(86400), False),
    ],
    ids=[
        "a first status is stamped",
        "unchanged within the heartbeat: no write",
        "unchanged at the heartbeat: refreshed",
        "unchanged but never stamped: stamped",
        "any change is written with the time",
        "a finished run is left alone",
        "a finished run without a stamp is left alone too",
    ],
)
def test_status_to_write(old: dict, new: dict, now: dt.datetime, written: bool) -> None:
    data = status_to_write(old, new, now)
    assert (data is not None) == written
    if data is not None:
        assert data == {**new, "observedAt": now.strftime("%Y-%m-%dT%H:%M:%SZ")}
