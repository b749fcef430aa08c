"""(CPU) A float64 model of one row's online softmax in the wgmma kernels (mla_wgmma.cuh,
mla_wgmma_rows.cuh) with their conditional rescale: per 64-key block the row's running max
m (log2 domain) moves only when the block's max exceeds it by more than kRescaleSlack, O
and l are rescaled only then, and P = 2^(x - m).  Checks the policy, not the CUDA code:
the result equals the exact softmax and its lse, P never exceeds 2^slack, masked keys and
rows that see no key come out as the kernels' contract says; a planted fault (the max
moved, the rescale skipped) is caught by the rising sequences the strategy draws, as the
GPU test with a ramp in the rope column (test_hopper_wgmma_gpu.py) does on the kernels.
The slack is read from mla_common.cuh, so the model cannot drift from the kernels."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlagen.paths import TEMPLATES_DIR

BLOCK = 64
NEG = -math.inf


def kernel_slack() -> float:
    text = (TEMPLATES_DIR / "hopper" / "include" / "mla_common.cuh").read_text()
    m = re.search(r"constexpr float kRescaleSlack = ([0-9.]+)f;", text)
    assert m, "kRescaleSlack not found in mla_common.cuh"
    return float(m.group(1))


def online(x: list[float], v: list[float], slack: float, skip_moved_rescale=False):
    """The kernels' loop over 64-key blocks of scores x (log2 domain, -inf = masked) and
    values v (one column): (out, lse2, largest P).  out = O / l (NaN-free 0 for a row with
    no key: the kernels write l = 0 rows as 0 and lse as -inf / +inf by output kind)."""
    m, l, o, pmax = NEG, 0.0, 0.0, 0.0
    for b0 in range(0, len(x), BLOCK):
        xs, vs = x[b0:b0 + BLOCK], v[b0:b0 + BLOCK]
        mc = max(xs)
        move = mc > m + slack                 # m = -inf: any finite block max moves
        mn = mc if move else m
        alpha = 2.0 ** (m - mn) if move else 1.0
        if skip_moved_rescale:
            alpha = 1.0
        ms = 0.0 if mn == NEG else mn         # every key masked so far: 2^-inf = 0
        p = [0.0 if xi == NEG else 2.0 ** (xi - ms) for xi in xs]
        pmax = max(pmax, max(p))
        l = l * alpha + sum(p)
        o = o * alpha + sum(pi * vi for pi, vi in zip(p, vs))
        m = mn
    out = o / l if l > 0 else 0.0
    lse2 = m + math.log2(l) if l > 0 else NEG
    return out, lse2, pmax


def exact(x: list[float], v: list[float]):
    live = [(xi, vi) for xi, vi in zip(x, v) if xi != NEG]
    if not live:
        return 0.0, NEG
    mx = max(xi for xi, _ in live)
    w = [2.0 ** (xi - mx) for xi, _ in live]
    return sum(wi * vi for wi, (_, vi) in zip(w, live)) / sum(w), mx + math.log2(sum(w))


@st.composite
def rows(draw):
    """Scores of one row: noise, plus (often) a ramp rising `step` log2 units a block, so the
    max moves mid-row past the slack and inside it; a masked tail (the causal limit or a
    piece's end) and sometimes a row that sees nothing."""
    n = draw(st.integers(1, 9 * BLOCK))
    step = draw(st.sampled_from([0.0, 0.5, 3.0, 6.0, 9.0, 12.0, 40.0]))
    spread = draw(st.sampled_from([0.1, 1.0, 4.0, 20.0]))
    seed = draw(st.integers(0, 2 ** 16))
    import random

    rng = random.Random(seed)
    x = [step * t / BLOCK + rng.gauss(0.0, spread) for t in range(n)]
    limit = draw(st.integers(0, n))
    x = [xi if t < limit else NEG for t, xi in enumerate(x)]
    v = [rng.uniform(-1.0, 1.0) for _ in range(n)]
    return x, v


@settings(max_examples=400, deadline=None, derandomize=True)
@given(rows())
def test_conditional_rescale_equals_the_exact_softmax(row):
    x, v = row
    slack = kernel_slack()
    out, lse2, pmax = online(x, v, slack)
    ref_out, ref_lse2 = exact(x, v)
    assert pmax <= 2.0 ** slack * (1 + 1e-12)     # bf16 / fp16 P has room for it
    assert out == pytest.approx(ref_out, rel=1e-9, abs=1e-12)
    if ref_lse2 == NEG:
        assert lse2 == NEG
    else:
        assert lse2 == pytest.approx(ref_lse2, rel=1e-12, abs=1e-9)


def test_the_slack_is_what_the_kernels_were_measured_with():
    # 2^8 in P: bf16 P keeps 8 bits of mantissa at any magnitude, fp16 P's 65504 is far off
    assert kernel_slack() == 8.0


def test_a_ramp_moves_the_max_past_and_inside_the_slack():
    """The GPU test's ramp (6 log2 units a block): the max moves every other block, and the
    blocks between carry P well above 1."""
    slack = kernel_slack()
    x = [6.0 * t / BLOCK for t in range(10 * BLOCK)]
    moves, m = 0, NEG
    for b0 in range(0, len(x), BLOCK):
        mc = max(x[b0:b0 + BLOCK])
        if mc > m + slack:
            moves, m = moves + 1, mc
    assert 3 <= moves <= 7
    assert online(x, [1.0] * len(x), slack)[2] > 2.0 ** (slack / 2)


def test_skipping_the_moved_rescale_is_caught():
    """A planted fault: the max moved but O and l kept their old scale.  The rising rows of
    the strategy must expose it (on flat rows the max moves only at the first block, where O
    and l are still 0, so nothing would)."""
    slack = kernel_slack()
    caught = 0
    for step in (12.0, 40.0):
        x = [step * t / BLOCK for t in range(4 * BLOCK)]
        v = [math.sin(t) for t in range(len(x))]
        bad, _, _ = online(x, v, slack, skip_moved_rescale=True)
        good, _ = exact(x, v)
        caught += abs(bad - good) > 1e-3
    assert caught == 2
    flat = [0.1 * math.cos(t) for t in range(4 * BLOCK)]
    v = [math.sin(t) for t in range(len(flat))]
    assert online(flat, v, slack, skip_moved_rescale=True)[0] == pytest.approx(exact(flat, v)[0])
