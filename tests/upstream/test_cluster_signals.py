"""``python -m upstream.cluster`` stops on a signal wherever its start is, a readiness probe included."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from upstream.cluster import ControlPlane, StartError, StopSignalError, _stop_on_signal


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_during_a_readiness_probe_stops_the_start(tmp_path: Path, sig: signal.Signals) -> None:
    """The probe's own errors mean "not ready yet"; the stop signal raised inside it is not one of them."""
    plane = ControlPlane(tmp_path)
    probes: list[int] = []

    def probe() -> bool:
        probes.append(1)
        os.kill(os.getpid(), sig)  # the handler raises here, inside the probe, as when it arrives mid-request
        return False

    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
    try:
        signal.signal(sig, _stop_on_signal)
        with pytest.raises(StopSignalError):
            try:
                plane.wait("a probe the signal interrupts", None, probe, timeout=5)
            except StartError as exc:  # the old behaviour: the signal swallowed, the probe polled to its deadline
                pytest.fail(f"the stop signal was taken for a failed probe: {exc}")
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
    assert probes == [1]
