"""Where ``reseed`` finds the generators' states, and what ``_settle.reseed`` leaves in them.

Every check here runs on generators the test makes itself (the helper writes where it is told).
That executions draw fresh numbers through a real zygote, in both setups, is
``test_native_setup.test_every_execution_draws_fresh_random_numbers``.
"""

from __future__ import annotations

import ctypes
import random
import struct
import sys

import numpy
import pytest

from retool.sandbox import child, reseed


def _helper():  # the compiled module
    if child.native_setup_error() is not None:
        pytest.skip(child.native_setup_error())
    return child._native


def _plan(*regions: tuple[int, int, int]) -> bytes:
    return b"".join(struct.pack("=QQq", *region) for region in regions)


def test_a_python_generator_is_found_where_its_state_lives() -> None:
    """The address is the live state, not a copy: a draw moves the index read there."""
    generator = random.Random(7)
    region = reseed.python_region(generator)
    assert region is not None
    _state_at, index_at = region
    generator.random()  # the twist, then two words
    assert int.from_bytes(ctypes.string_at(index_at, 4), sys.byteorder) == generator.getstate()[1][reseed.MT_WORDS] == 2
    generator.random()
    assert int.from_bytes(ctypes.string_at(index_at, 4), sys.byteorder) == 4 and reseed.python_region(generator) == region


def test_a_state_that_does_not_read_back_is_not_used() -> None:
    class Lying(random.Random):
        def getstate(self):
            version, internal, gauss = super().getstate()
            return version, (internal[0] ^ 1, *internal[1:]), gauss

    assert reseed.python_region(Lying(3)) is None
    assert reseed.numpy_region(numpy.random.Generator(numpy.random.PCG64(1))) is None  # not a RandomState over an MT19937


def test_the_helper_leaves_a_python_generator_as_seeding_from_the_os_does() -> None:
    settle = _helper()
    generator, twin = random.Random(11), random.Random(11)
    state_at, index_at = reseed.python_region(generator)  # type: ignore[misc]
    settle.reseed(_plan((state_at, index_at, reseed.PYTHON_INDEX)))
    internal = generator.getstate()[1]
    assert internal[0] == 0x80000000 and internal[reseed.MT_WORDS] == reseed.PYTHON_INDEX
    assert internal[1 : reseed.MT_WORDS] != twin.getstate()[1][1 : reseed.MT_WORDS]
    draws = [generator.random() for _ in range(2000)]
    assert draws != [twin.random() for _ in range(2000)] and all(0 <= x < 1 for x in draws)
    assert 0.45 < sum(draws) / len(draws) < 0.55  # 2000 uniforms: sd of the mean 0.0065


def test_the_helper_leaves_numpys_global_kind_as_numpy_seeds_it() -> None:
    settle = _helper()
    state, twin = numpy.random.RandomState(5), numpy.random.RandomState(5)
    region = reseed.numpy_region(state)
    assert region is not None
    settle.reseed(_plan((*region, reseed.NUMPY_INDEX)))
    fresh = numpy.random.RandomState()  # numpy's own seeding from the OS, for comparison
    for seeded in (state, fresh):
        _, key, pos, has_gauss, _ = seeded.get_state()
        assert (int(key[0]), pos, has_gauss) == (0x80000000, reseed.NUMPY_INDEX, 0)
    assert not numpy.array_equal(state.get_state()[1], twin.get_state()[1])
    assert state.random(3).tolist() != twin.random(3).tolist()


def test_the_helper_refuses_regions_it_cannot_read() -> None:
    settle = _helper()
    with pytest.raises(ValueError, match="not \\(state, index, value\\) triples"):
        settle.reseed(b"\x00" * 16)
    settle.reseed(b"")  # nothing to do


def test_the_plan_covers_what_the_process_imported() -> None:
    """With the helper: every generator by address; without: each by its ``seed()``. Either way
    random's own at-fork seed is skipped (done with the others, after the baseline is measured)."""
    import sympy.core.random as sympy_random

    native = reseed.locate(native=True)
    assert len(native.native) == 4 * reseed._REGION.size  # random, sympy's two, numpy's global
    assert native.seeds == () and native.covered == (random._inst.seed,)
    python = reseed.locate(native=False)
    assert python.native == b"" and python.covered == (random._inst.seed,)
    assert python.seeds == (random._inst.seed, sympy_random.rng.seed, sympy_random._assumptions_rng.seed, numpy.random.mtrand._rand.seed)
