"""Fresh seeds, in every execution, for the random generators the warm interpreter holds.

A fresh ``python main.py`` seeds its generators from the OS when their modules are imported. Every
execution here is a fork of one warm interpreter and inherits their state, so without a reseed
every execution draws the same numbers: ``sympy.randprime(10**6, 10**7)`` returned the same prime
in every execution until this module existed (sympy's generators were never reseeded; Python's
``random`` was, by its own at-fork hook, and numpy's global one from a 32-bit seed).

The generators (``GENERATORS``) are Mersenne Twisters (MT19937): 624 32-bit words and an index.
Their own ``seed()`` costs an execution ~0.2-0.37 ms of CPU (measured without them in
``bench/sandbox_execution_cpu.py``: most of it Python frames and objects touching pages the fork
shares, each a copy-on-write fault). Where the compiled helper is built (``_settle.c``), the
execution instead writes words from ``getrandom`` straight into each state and leaves it as
seeding from the OS does: the first word 0x80000000 (never the all-zero state, which MT19937
cannot leave) and the other 623 random, the index at 624 for Python's generators (CPython's
``init_by_array``) and at 623 for numpy's (numpy 1.26 ``_mt19937.pyx``: ``MT19937()`` and
``seed()`` leave the loop variable there). numpy's global one used to get a 32-bit integer seed
here, one of 2**32 states.

Where each state lies: numpy's documented ``bit_generator.ctypes.state_address`` (numpy's
``mt19937_state``: the 624 words, then the index), and for Python's generators CPython's
``RandomObject`` (``Modules/_randommodule.c``, 3.10-3.13: the object header, the index, the 624
words). The zygote uses an address only after reading back, there, the very state the generator's
own ``getstate()`` reports; a generator whose check fails is seeded by its ``seed()`` instead.
"""

from __future__ import annotations

import ctypes
import random
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass

MT_WORDS = 624
STATE_BYTES = MT_WORDS * 4
_REGION = struct.Struct("=QQq")  # the state's address, the index's, the index's value: ``_settle.c``'s ``reseed``
PYTHON_INDEX = MT_WORDS
"""Where CPython's ``init_by_array`` leaves the index (``Modules/_randommodule.c``)."""
NUMPY_INDEX = MT_WORDS - 1
"""Where numpy's seeding from the OS leaves it (``_mt19937.pyx``: ``pos = i`` after ``range(1, 624)``)."""

GENERATORS = (("random", "_inst"), ("sympy.core.random", "rng"), ("sympy.core.random", "_assumptions_rng"))
"""Python ``random.Random`` instances that their modules seed from the OS at import (found only
where the template imported the module; ``random._inst`` is also what ``random.random`` draws from)."""
NUMPY_GLOBAL = ("numpy.random.mtrand", "_rand")
"""numpy's global ``RandomState``, behind ``numpy.random.random``, ``numpy.random.rand`` and the rest."""


@dataclass(frozen=True)
class Plan:
    """How an execution reseeds, decided once in the zygote (``locate``)."""

    native: bytes
    """(state address, index address, index value) for ``_settle.reseed``; empty: nothing for it."""
    seeds: tuple[Callable[[], object], ...]
    """``seed()`` of the generators the helper does not reseed (no helper, or a failed check)."""
    covered: tuple[Callable[[], object], ...]
    """At-fork functions this plan replaces (``random._inst.seed``): the raw fork skips them."""


def locate(native: bool) -> Plan:
    """In the zygote: the plan for the generators present (none is imported here). With ``native``
    false every generator is seeded by its ``seed()`` (the Python setup path).

    Both paths do the same before an execution measures its address-space baseline (RLIMIT_AS is
    that baseline + the job's limit, and ``test_native_setup`` compares the two paths' limits): the
    states are located either way (the check allocates), and random's own at-fork ``seed`` is
    skipped either way and done with the others after the baseline. Run at the fork on one path
    only, its allocations once moved that path's baseline by a heap step (136 KiB)."""
    regions: list[tuple[int, int, int]] = []
    seeds: list[Callable[[], object]] = []
    covered: list[Callable[[], object]] = []
    for module_name, attribute in GENERATORS:
        generator = getattr(sys.modules.get(module_name), attribute, None)
        if not isinstance(generator, random.Random) or isinstance(generator, random.SystemRandom):
            continue
        generator.gauss_next = None  # as ``seed()`` leaves it; the executions inherit it
        found = python_region(generator)  # either way: both setups leave the zygote's heap alike
        region = found if native else None
        if module_name == "random":  # random registers ``_inst.seed`` to run after every fork
            covered.append(generator.seed)
        if region is not None:
            regions.append((*region, PYTHON_INDEX))
        else:
            seeds.append(generator.seed)
    numpy_global = getattr(sys.modules.get(NUMPY_GLOBAL[0]), NUMPY_GLOBAL[1], None)
    if numpy_global is not None:
        if numpy_global.get_state(legacy=False).get("has_gauss"):
            numpy_global.seed()  # drop a cached Gaussian, which no reseed of the words would
        found_numpy = numpy_region(numpy_global)
        region = found_numpy if native else None
        if region is not None:
            regions.append((*region, NUMPY_INDEX))
        else:
            seeds.append(numpy_global.seed)
    return Plan(b"".join(_REGION.pack(*region) for region in regions), tuple(seeds), tuple(covered))


def python_region(generator: random.Random) -> tuple[int, int] | None:
    """Where CPython keeps this generator's words and index, if reading them there gives back
    exactly its ``getstate()``; None otherwise (another interpreter or layout)."""
    head = object.__basicsize__
    if sys.implementation.name != "cpython" or type(generator).__basicsize__ < head + 4 + STATE_BYTES:
        return None
    version, internal, _gauss = generator.getstate()
    if version != 3 or len(internal) != MT_WORDS + 1:
        return None
    index_at, state_at = id(generator) + head, id(generator) + head + 4
    if ctypes.string_at(state_at, STATE_BYTES) != struct.pack(f"={MT_WORDS}I", *internal[:MT_WORDS]):
        return None
    if int.from_bytes(ctypes.string_at(index_at, 4), sys.byteorder, signed=True) != internal[MT_WORDS]:
        return None
    return state_at, index_at


def numpy_region(state: object) -> tuple[int, int] | None:
    """The words and index of numpy's ``RandomState`` ``state`` (an MT19937 behind it), checked
    against its own ``get_state()``; None when it is not an MT19937 or does not read back."""
    bit_generator = getattr(state, "_bit_generator", None)
    if type(bit_generator).__name__ != "MT19937":
        return None
    words = state.get_state(legacy=False)["state"]  # type: ignore[attr-defined]
    state_at = bit_generator.ctypes.state_address
    key, pos = words["key"], words["pos"]
    if key.dtype.itemsize != 4 or len(key) != MT_WORDS or ctypes.string_at(state_at, STATE_BYTES) != key.tobytes():
        return None
    if int.from_bytes(ctypes.string_at(state_at + STATE_BYTES, 4), sys.byteorder, signed=True) != pos:
        return None
    return state_at, state_at + STATE_BYTES
