"""The power-of-two scale of the 64-row kernel's 16-bit partials and cluster-merge exchange
(templates/hopper/include/mla_fp16_scale.cuh, compiled here with g++): for any row maximum
the scale and its inverse are normal floats whose product is exactly 1, the scaled maximum
lands in [2^14, 2^15) (so fp16 cannot overflow), and every value of the row then keeps 11
significant bits relative to the maximum once rounded to fp16 (numpy's IEEE half).  The GPU
tests check the kernels end to end (test_hopper_wgmma_gpu.py, range of V)."""

from __future__ import annotations

import ctypes
import math
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hopper_util import build_header_harness

HARNESS = r"""
#include "mla_fp16_scale.cuh"
extern "C" int scale_biased(int e) { return mlagen::hopper::fp16_scale_biased(e); }
"""


@pytest.fixture(scope="module")
def scale_biased(tmp_path_factory):
    lib = build_header_harness(tmp_path_factory.mktemp("scale"), HARNESS)
    lib.scale_biased.restype = ctypes.c_int
    return lib.scale_biased


def _bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def _from_exponent(biased: int) -> float:
    return struct.unpack("<f", struct.pack("<I", biased << 23))[0]


def _scale(scale_biased, amax: float) -> tuple[float, float]:
    """(s, 1 / s) as the kernel forms them from the row maximum's bits."""
    sb = scale_biased((_bits(amax) >> 23) & 0xFF)
    return _from_exponent(sb), _from_exponent(254 - sb)


F32_MAX = float(np.finfo(np.float32).max)
finite_f32 = st.floats(min_value=0.0, max_value=F32_MAX, allow_nan=False, allow_infinity=False,
                       allow_subnormal=True, width=32)


@settings(max_examples=500, deadline=None)
@given(amax=finite_f32)
def test_scale_is_a_normal_power_of_two_with_an_exact_inverse(scale_biased, amax):
    s, inv = _scale(scale_biased, amax)
    for x in (s, inv):
        assert math.isfinite(x) and x >= 2.0 ** -126          # normal, not 0 or subnormal
        assert math.frexp(x)[0] == 0.5                          # a power of two
    assert s * inv == 1.0
    scaled = np.float32(amax) * np.float32(s)
    assert scaled < 2.0 ** 15                                   # fp16 cannot overflow
    if amax >= 2.0 ** -112:                                     # not clamped at s = 2^126
        assert scaled >= 2.0 ** 14


@settings(max_examples=300, deadline=None)
@given(amax=st.floats(min_value=2.0 ** -100, max_value=F32_MAX / 2, width=32),
       fractions=st.lists(st.floats(min_value=-1.0, max_value=1.0, width=32), min_size=1,
                          max_size=64))
def test_a_row_keeps_11_bits_relative_to_its_maximum(scale_biased, amax, fractions):
    """Values x = f * amax (|f| <= 1) through x * s -> fp16 -> * (1 / s): error at most
    half an fp16 ulp of the scaled maximum, i.e. 2^-11 relative to amax."""
    s, inv = _scale(scale_biased, amax)
    x = np.float32(amax) * np.array(fractions, dtype=np.float32)
    back = (x * np.float32(s)).astype(np.float16).astype(np.float32) * np.float32(inv)
    assert np.all(np.isfinite(back))
    assert float(np.max(np.abs(back.astype(np.float64) - x))) <= amax * 2.0 ** -11


@pytest.mark.parametrize("special", [float("inf"), float("nan")])
def test_inf_and_nan_rows_pass_through_with_scale_1(scale_biased, special):
    s, inv = _scale(scale_biased, special)
    assert s == 1.0 and inv == 1.0


def test_zero_and_subnormal_rows_stay_finite(scale_biased):
    for amax in (0.0, 1e-45, 1e-40, 2.0 ** -126):
        s, inv = _scale(scale_biased, amax)
        assert s == 2.0 ** 126 and inv == 2.0 ** -126
        assert np.float32(amax) * np.float32(s) < 2.0 ** 15
