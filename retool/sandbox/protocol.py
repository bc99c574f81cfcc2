"""Length-prefixed messages between the server, the template, the workers and their zygotes (Unix sockets).

JSON between the server, the template and the workers; ``MARSHAL`` between a worker and its zygote.
"""

from __future__ import annotations

import asyncio
import json
import marshal
import socket
import struct
from collections.abc import Callable
from typing import Any, NamedTuple

_HEADER = struct.Struct("!I")
MAX_MESSAGE = 256 << 20


class ChannelClosedError(ConnectionError):
    """The other end went away (a dead worker or template)."""


class Codec(NamedTuple):
    dumps: Callable[[Any], bytes]
    loads: Callable[[bytes], Any]


JSON = Codec(lambda message: json.dumps(message, separators=(",", ":")).encode(), json.loads)
MARSHAL = Codec(marshal.dumps, marshal.loads)
"""Between a worker and its zygote, and for the job a worker writes on its execution's pipe (read
before any of the job's code runs): written only by processes of the replica, never by an execution
(marshal is not meant for bytes an adversary could write). One C call each way: JSON's Python
layers touched ~40 more of the zygote's pages after every fork, each a copy-on-write fault while the
execution it just forked shares them, and the job's cost its execution 31 faults against 7
(bench/RESULTS.md, "the raw fork")."""


def encode(message: dict[str, Any], codec: Codec = JSON) -> bytes:
    body = codec.dumps(message)
    return _HEADER.pack(len(body)) + body


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    chunks = []
    while size:
        chunk = sock.recv(min(size, 1 << 20))
        if not chunk:
            raise ChannelClosedError("peer closed the channel")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def send(sock: socket.socket, message: dict[str, Any], fds: list[int] | None = None, codec: Codec = JSON) -> None:
    data = encode(message, codec)
    if fds:
        socket.send_fds(sock, [data[:_HEADER.size]], fds)
        sock.sendall(data[_HEADER.size:])
    else:
        sock.sendall(data)


def recv(sock: socket.socket, with_fds: int = 0, codec: Codec = JSON) -> tuple[dict[str, Any], list[int]]:
    fds: list[int] = []
    if with_fds:
        header, fds, _flags, _addr = socket.recv_fds(sock, _HEADER.size, with_fds)
        if not header:
            raise ChannelClosedError("peer closed the channel")
        if len(header) < _HEADER.size:
            header += _recv_exact(sock, _HEADER.size - len(header))
    else:
        header = _recv_exact(sock, _HEADER.size)
    (size,) = _HEADER.unpack(header)
    if size > MAX_MESSAGE:
        raise ChannelClosedError(f"message of {size} bytes is over the limit")
    return codec.loads(_recv_exact(sock, size)), fds


async def read_message(reader: asyncio.StreamReader) -> dict[str, Any]:
    try:
        header = await reader.readexactly(_HEADER.size)
        (size,) = _HEADER.unpack(header)
        if size > MAX_MESSAGE:
            raise ChannelClosedError(f"message of {size} bytes is over the limit")
        return json.loads(await reader.readexactly(size))
    except asyncio.IncompleteReadError as exc:
        raise ChannelClosedError("peer closed the channel") from exc
