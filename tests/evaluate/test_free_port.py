"""``free_port``: a port for a server started next, that nothing else on the machine is handed meanwhile.

The kernel hands ports of its ephemeral range to every outgoing connection and every ``bind(0)``; a
port picked there was taken again, on a busy machine, before kube-apiserver's controller manager bound
it ("bind: address already in use", the whole end-to-end control plane down). So the pick is below
that range, and never a port something is bound to.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from retool.embedded import process
from retool.embedded.process import ephemeral_range, free_port


class Scripted:
    """Stands in for the random picker: hands out ``ports`` in order."""

    def __init__(self, ports: list[int]) -> None:
        self.ports = iter(ports)

    def randrange(self, low: int, high: int) -> int:
        port = next(self.ports)
        assert low <= port < high, (low, port, high)
        return port


@pytest.fixture
def held() -> Iterator[int]:
    """A port below the ephemeral range that a listening socket holds."""
    low, _ = ephemeral_range()
    with socket.socket() as s:
        for port in range(low - 1, process.LOWEST_PICKED, -1):
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            s.listen()
            yield port
            return
    pytest.fail("no port below the ephemeral range could be bound")


def test_the_port_is_below_the_ephemeral_range_and_a_server_can_bind_it() -> None:
    low, _ = ephemeral_range()
    for _ in range(20):
        port = free_port()
        assert process.LOWEST_PICKED <= port < low
        with socket.socket() as server:
            server.bind(("127.0.0.1", port))


def test_a_port_something_is_bound_to_is_passed_over(held: int, monkeypatch: pytest.MonkeyPatch) -> None:
    free = next(p for p in range(process.LOWEST_PICKED, held) if process._bindable("127.0.0.1", p))
    monkeypatch.setattr(process, "_pick", Scripted([held, free]))
    assert free_port() == free


def test_where_the_range_leaves_no_room_the_kernel_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(process, "ephemeral_range", lambda: (process.LOWEST_PICKED + 10, 60999))
    monkeypatch.setattr(process, "_pick", Scripted([]))  # any draw fails the test
    port = free_port()
    with socket.socket() as server:
        server.bind(("127.0.0.1", port))


def test_the_kernels_range_is_read_from_proc() -> None:
    low, high = ephemeral_range()
    text = process.EPHEMERAL_RANGE.read_text().split() if process.EPHEMERAL_RANGE.exists() else ["32768", "60999"]
    assert (low, high) == (int(text[0]), int(text[1]))
