"""The honest SC11 figures: hardware floors, the machine-model readings (L2 per chip, SDMA
engine count, the cube's fp32 rate), and the double-buffer saving as a mechanism -- it
appears when transfers and compute are comparable and vanishes when one dominates -- rather
than as one calibrated number."""

from __future__ import annotations

import functools

import pytest

from mlagen.backends.sc11 import bench, ranges
from mlagen.backends.sc11.costmodel import TraceBuilder, default_machine, simulate
from mlagen.backends.sc11.trace import Engine, Mem


# ---------------------------------------------------------------- machine readings ------
def _two_l2_loads():
    tb = TraceBuilder()
    for c in (0, 1):
        tb.dma(c, Engine.GDMA, Mem.L2, Mem.LMEM, 1 << 20)
    return tb.array()


def test_l2_per_core_is_unshared_and_per_chip_is_one_port():
    mc = default_machine()
    t_core = simulate(_two_l2_loads(), mc).total_s
    t_chip = simulate(_two_l2_loads(), mc.replace(l2_scope="chip")).total_s
    pre = max(mc.latency[Mem.L2], mc.latency[Mem.LMEM]) + mc.issue / mc.dma_hz
    one = (1 << 20) / mc.l2_bw
    assert t_core == pytest.approx(pre + one, rel=1e-6)
    assert t_chip == pytest.approx(pre + 2 * one, rel=1e-6)


def test_sdma_engines_share_their_bandwidth():
    tb = TraceBuilder()
    for c in range(4):
        tb.dma(c, Engine.SDMA, Mem.DDR, Mem.L2, 1 << 20)
    tr = tb.array()
    mc = default_machine()
    many = simulate(tr, mc).total_s                          # 4 x 128 GB/s < 546 GB/s DDR
    one = simulate(tr, mc.replace(sdma_engines=1)).total_s   # all four share 128 GB/s
    pre = mc.latency[Mem.DDR] + mc.issue / mc.dma_hz
    assert many == pytest.approx(pre + (1 << 20) / mc.sdma_bw, rel=1e-6)
    assert one == pytest.approx(pre + 4 * (1 << 20) / mc.sdma_bw, rel=1e-6)


def test_an_fp32_operand_matmul_is_charged_the_fp32_rate():
    mc = default_machine()
    for fp32 in (False, True):
        tb = TraceBuilder()
        tb.matmul(0, 128, 512, 1024, fp32=fp32)
        t = simulate(tb.array(), mc).total_s
        k_steps = 1024 // (mc.cube_ic // (mc.cube_fp32_slowdown if fp32 else 1))
        cyc = 512 // 64 * k_steps * 128 // 4 + mc.mm_startup + mc.issue
        assert t == pytest.approx(cyc / mc.bdc_hz)


# ---------------------------------------------------------------- floors ----------------
@functools.lru_cache(maxsize=None)
def _sims(batch=32, seqlen=512):
    """The seed schedule at a smaller batch (4 KV steps a core): 1 and 2 buffers."""
    _, sims = bench.run_point(bench._schedule(None), batch, seqlen, (1, 2), keep=True)
    return sims[(1, "batch")], sims[(2, "batch")]


def test_floors_add_up_and_are_never_beaten():
    _, d = _sims()
    segs = ranges.phase_floors(d)
    assert [s.phases for s in segs] == ["A", "B", "C"]
    assert sum(s.ddr_bytes for s in segs) == d.ddr_bytes
    assert sum(s.time_s for s in segs) == pytest.approx(d.total_s)
    for s in segs:
        assert s.ratio >= 1.0, s
    assert ranges.floor_s(d) <= d.total_s
    assert "simulated / floor" in ranges.floors_table(d)


# ---------------------------------------------------------------- the mechanism ---------
def _phase_b_saving(mc) -> float:
    one, two = _sims()
    b1 = [s for s in ranges.phase_floors(simulate(one.events, mc)) if s.phases == "B"][0]
    b2 = [s for s in ranges.phase_floors(simulate(two.events, mc)) if s.phases == "B"][0]
    return 1.0 - b2.time_s / b1.time_s


def test_saving_appears_when_transfers_and_compute_are_comparable():
    # default reading: per step the gather (~8.6 us) and GDMA + BDC (~12 us) are comparable
    assert _phase_b_saving(default_machine()) > 0.2


def test_saving_vanishes_when_compute_dominates():
    mc = default_machine()
    assert _phase_b_saving(mc.replace(bdc_hz=mc.bdc_hz / 30)) < 0.05


def test_saving_vanishes_when_transfers_dominate():
    mc = default_machine()
    slow = mc.replace(sdma_bw=mc.sdma_bw / 30, ddr_bw_chip=mc.ddr_bw_chip / 30,
                      ddr_bw_core=mc.ddr_bw_core / 30)
    # the gather is 30x the rest; only the first GDMA + BDC of a core can hide under it
    assert _phase_b_saving(slow) < 0.08


# ---------------------------------------------------------------- auto's regret ---------
def test_auto_regret_is_measured_against_other_readings():
    reg = ranges.auto_regret(batches=(1,), seqlens=(1024,), readings=ranges.READINGS[:2])
    assert len(reg.rows) == 2
    assert reg.rows[0][5] == 0.0                 # the default reading: auto is the argmin
    assert all(r[5] >= 0 for r in reg.rows)
    assert "worst regret" in reg.markdown()
