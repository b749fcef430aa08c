"""The SC11 cost model on hand-built traces with known answers."""

from __future__ import annotations

import time

import numpy as np
import pytest

from mlagen.backends.sc11.costmodel import TraceBuilder, default_machine, simulate
from mlagen.backends.sc11.trace import EVENT_DTYPE, Engine, Mem
from mlagen.errors import EmulatorError

from test_sc11_cost_synth import pipeline

MC = default_machine()
CYCLE = 1.0 / MC.bdc_hz
ISSUE_S = MC.issue / MC.dma_hz


def mm_seconds(m, n, k):
    cyc = (-(-n // 64)) * (-(-k // 32)) * (-(-m // 4)) + MC.mm_startup + MC.issue
    return cyc * CYCLE


# ---- single events -------------------------------------------------------------------
@pytest.mark.parametrize("engine,src,dst,lat,bw", [
    (Engine.GDMA, Mem.DDR, Mem.LMEM, MC.latency[Mem.DDR], min(MC.gdma_port, MC.ddr_bw_core)),
    (Engine.GDMA, Mem.L2, Mem.LMEM, MC.latency[Mem.L2], min(MC.gdma_port, MC.l2_bw)),
    (Engine.SDMA, Mem.DDR, Mem.L2, MC.latency[Mem.DDR], MC.sdma_bw),
    (Engine.GDMA, Mem.LMEM, Mem.LMEM, MC.latency[Mem.LMEM], MC.gdma_port),
])
def test_one_dma_is_latency_plus_bytes_over_bandwidth(engine, src, dst, lat, bw):
    nbytes = 256 * 1000
    tb = TraceBuilder()
    tb.dma(0, engine, src, dst, nbytes)
    r = simulate(tb.array())
    assert r.total_s == pytest.approx(lat + ISSUE_S + nbytes / bw, rel=1e-9)


def test_dma_pieces_are_padded_to_the_alignment():
    tb = TraceBuilder()
    tb.dma(0, Engine.GDMA, Mem.L2, Mem.LMEM, 10 * 100, pieces=10)    # 10 pieces of 100 B
    r = simulate(tb.array())
    bw = min(MC.gdma_port, MC.l2_bw)
    assert r.total_s == pytest.approx(MC.latency[Mem.L2] + ISSUE_S + 10 * 256 / bw)


def test_matmul_cycles_pad_to_the_cube_granules():
    def one(m, n, k):
        tb = TraceBuilder()
        tb.matmul(0, m, n, k)
        return simulate(tb.array()).total_s
    assert one(32, 512, 576) == pytest.approx(mm_seconds(32, 512, 576))
    assert one(1, 64, 32) == one(4, 64, 32)           # m pads to 4
    assert one(4, 65, 32) == one(4, 128, 32)          # n pads to 64 lanes
    assert one(4, 64, 33) == one(4, 64, 64)           # k pads to 32 input channels
    assert one(8, 64, 32) > one(4, 64, 32)


def test_vector_cycles():
    tb = TraceBuilder()
    tb.vector(0, 64 * 16 * 10 + 1)                    # 11 cycles of 64 lanes x 16 fp32
    r = simulate(tb.array())
    assert r.total_s == pytest.approx((11 + MC.issue) * CYCLE)


# ---- queues, deps, overlap ------------------------------------------------------------
def balanced_pair():
    """A GDMA and a matmul that take the same time."""
    m, n, k = 64, 512, 512
    t_mm = mm_seconds(m, n, k)
    bw = min(MC.gdma_port, MC.l2_bw)
    nbytes = int(round((t_mm - MC.latency[Mem.L2] - ISSUE_S) * bw / 256)) * 256
    return (m, n, k), nbytes, t_mm


def test_two_independent_engines_cost_the_max_not_the_sum():
    (m, n, k), nbytes, t_mm = balanced_pair()
    tb = TraceBuilder()
    tb.dma(0, Engine.GDMA, Mem.L2, Mem.LMEM, nbytes)
    tb.matmul(0, m, n, k)
    r = simulate(tb.array())
    t_dma = r.end[0] - r.start[0]
    assert t_dma == pytest.approx(t_mm, rel=2e-3)
    assert r.total_s == pytest.approx(max(t_dma, t_mm))
    assert r.total_s < 0.6 * (t_dma + t_mm)


def test_in_order_queue_serialises():
    tb = TraceBuilder()
    tb.matmul(0, 32, 512, 576)
    tb.matmul(0, 32, 512, 576)           # no dep: waits for the queue only
    tb.matmul(1, 32, 512, 576)           # another core: runs at once
    r = simulate(tb.array())
    t = mm_seconds(32, 512, 576)
    assert r.start[1] == pytest.approx(t)
    assert r.start[2] == 0.0
    assert r.total_s == pytest.approx(2 * t)


def test_a_dep_delays():
    tb = TraceBuilder()
    d = tb.dma(0, Engine.GDMA, Mem.DDR, Mem.LMEM, 1 << 20)
    tb.matmul(0, 32, 512, 576, deps=[d])
    r = simulate(tb.array())
    assert r.start[1] == pytest.approx(r.end[0])
    assert r.total_s == pytest.approx(r.end[0] + mm_seconds(32, 512, 576))
    # the BDC queue was idle while it waited: no gap inside it (it had not started)
    assert len(r.idle_gaps()) == 0


def test_idle_gap_inside_a_queue():
    tb = TraceBuilder()
    a = tb.matmul(0, 4, 64, 32)
    d = tb.dma(0, Engine.GDMA, Mem.DDR, Mem.LMEM, 1 << 16, deps=[a])
    tb.matmul(0, 4, 64, 32, deps=[d])
    r = simulate(tb.array())
    gaps = r.idle_gaps()
    assert len(gaps) == 1 and gaps["engine"][0] == Engine.BDC
    assert gaps["end"][0] - gaps["start"][0] == pytest.approx(r.end[1] - r.start[1])
    assert r.busy_share(0, Engine.BDC) == pytest.approx(2 * mm_seconds(4, 64, 32) / r.total_s)


def test_barrier_aligns_cores_and_fences_them():
    tb = TraceBuilder()
    tb.matmul(0, 4, 64, 32)                       # short
    tb.matmul(1, 256, 512, 576)                   # long
    b0 = tb.barrier(0, 7)
    b1 = tb.barrier(1, 7)
    after = tb.matmul(0, 4, 64, 32)               # no explicit dep: the fence holds it
    r = simulate(tb.array())
    long_s = mm_seconds(256, 512, 576)
    assert r.end[b0] == r.end[b1] == pytest.approx(long_s + MC.barrier_s)
    assert r.start[after] == pytest.approx(r.end[b0])
    assert r.barriers == 1


def test_ddr_is_shared_by_concurrent_flows():
    nbytes = 256 * 4096
    tb = TraceBuilder()
    tb.dma(0, Engine.SDMA, Mem.DDR, Mem.L2, nbytes)
    alone = simulate(tb.array()).total_s
    tb = TraceBuilder()
    for c in range(8):                            # 8 x 128 GB/s caps > 546 GB/s of DDR
        tb.dma(c, Engine.SDMA, Mem.DDR, Mem.L2, nbytes)
    r = simulate(tb.array())
    pre = MC.latency[Mem.DDR] + ISSUE_S
    assert alone == pytest.approx(pre + nbytes / MC.sdma_bw)
    assert r.total_s == pytest.approx(pre + nbytes / (MC.ddr_bw_chip / 8))
    assert r.total_s > 1.5 * alone


def test_ddr_shares_change_when_a_flow_ends():
    mc = MC.replace(ddr_bw_chip=128e9)
    a, b = 1 << 20, 2 << 20
    tb = TraceBuilder()
    tb.dma(0, Engine.SDMA, Mem.DDR, Mem.L2, a)
    tb.dma(1, Engine.SDMA, Mem.DDR, Mem.L2, b)
    r = simulate(tb.array(), mc)
    pre = MC.latency[Mem.DDR] + ISSUE_S
    t_a = pre + a / 64e9                          # half each while both run
    assert r.end[0] == pytest.approx(t_a)
    assert r.end[1] == pytest.approx(t_a + (b - a) / 128e9)   # then alone at its cap


def test_water_fill_respects_caps():
    mc = MC.replace(ddr_bw_chip=150e9)
    nbytes = 1 << 20
    tb = TraceBuilder()
    tb.dma(0, Engine.GDMA, Mem.DDR, Mem.LMEM, nbytes)   # cap 68.264 GB/s < fair 75
    tb.dma(1, Engine.SDMA, Mem.DDR, Mem.L2, 4 * nbytes)  # gets the rest, 81.7 GB/s
    r = simulate(tb.array(), mc)
    pre = MC.latency[Mem.DDR] + ISSUE_S
    assert r.end[0] == pytest.approx(pre + nbytes / MC.ddr_bw_core)
    moved = (r.end[0] - pre) * (150e9 - MC.ddr_bw_core)
    assert r.end[1] == pytest.approx(r.end[0] + (4 * nbytes - moved) / MC.sdma_bw)


# ---- bounds ---------------------------------------------------------------------------
def test_bound_and_ratio():
    tb = TraceBuilder()
    for c in range(8):
        tb.dma(c, Engine.GDMA, Mem.DDR, Mem.LMEM, 1 << 22)
    r = simulate(tb.array())
    assert r.ddr_bytes == 8 << 22
    assert r.bound_s == pytest.approx((8 << 22) / MC.ddr_bw_chip)
    assert 1.0 <= r.bound_ratio < 1.01
    tb = TraceBuilder()
    tb.matmul(0, 4096, 4096, 4096)
    r = simulate(tb.array())
    assert r.bound_s == pytest.approx(2 * 4096 ** 3 / MC.peak_flops_core)


def test_pipelined_bound_tracks_overlap():
    serial = simulate(pipeline(cores=1, steps=12, buffers=1).array())
    deep = simulate(pipeline(cores=1, steps=12, buffers=3).array())
    b = deep.pipelined_bound_s()
    assert b <= deep.total_s * 1.0001
    assert deep.total_s <= 1.1 * b                 # three slots: a real 3-stage pipeline
    assert serial.total_s > 1.5 * serial.pipelined_bound_s()   # no overlap: far from it
    # the bound is fill + sum of per-step maxima: about steps x the slowest stage
    stage = max(deep.busy[(0, e)] for e in (Engine.SDMA, Engine.GDMA, Engine.BDC)) / 12
    assert b == pytest.approx(12 * stage, rel=0.25)


def test_pipelined_bound_multi_core_takes_the_slowest_core_per_segment():
    tb = pipeline(cores=2, steps=4, buffers=3)
    two = simulate(tb.array())
    one = simulate(pipeline(cores=1, steps=4, buffers=3).array())
    assert two.pipelined_bound_s() >= one.pipelined_bound_s()
    assert two.pipelined_bound_s() <= two.total_s * 1.0001


# ---- bad traces -----------------------------------------------------------------------
def test_bad_traces_raise():
    tb = TraceBuilder()
    tb.dma(0, Engine.SDMA, Mem.DDR, Mem.LMEM, 256)
    with pytest.raises(EmulatorError, match="SDMA moves only between DDR and L2"):
        simulate(tb.array())
    tb = TraceBuilder()
    tb.matmul(0, 4, 4, 4, deps=[5])
    with pytest.raises(EmulatorError, match="not in the trace|later event"):
        simulate(tb.array())
    with pytest.raises(EmulatorError, match="dtype"):
        simulate(np.zeros(3, dtype=[("id", "i8")]))
    arr = TraceBuilder()
    arr.matmul(0, 4, 4, 4)
    arr.matmul(0, 4, 4, 4)
    a = arr.array()
    a["id"][1] = 0
    with pytest.raises(EmulatorError, match="duplicate"):
        simulate(a)


def test_deadlock_is_reported():
    tb = TraceBuilder()
    tb.barrier(0, 0)
    tb.barrier(1, 1)
    tb.barrier(1, 0)       # core 1 reaches barrier 0 only after barrier 1 ...
    tb.barrier(0, 1)       # ... which core 0 reaches only after barrier 0
    with pytest.raises(EmulatorError, match="deadlocks"):
        simulate(tb.array())


def test_empty_trace():
    r = simulate(np.zeros(0, dtype=EVENT_DTYPE))
    assert r.total_s == 0.0


def test_hundred_thousand_events_simulate_fast():
    tr = pipeline(cores=8, steps=1000, buffers=2).array()
    assert len(tr) > 100_000
    # CPU time of this process, not wall time: a loaded CI machine must not fail it, a
    # quadratic simulator still would
    t0 = time.process_time()
    r = simulate(tr)
    took = time.process_time() - t0
    assert r.total_s > 0
    assert took < 1.5, f"{len(tr)} events took {took:.2f} s of CPU"   # ~0.35 s on the dev box


def test_barrier_waits_are_not_idle_gaps():
    tb = TraceBuilder()
    tb.barrier(0, 0)
    tb.barrier(1, 0)
    tb.matmul(0, 256, 512, 576)
    tb.barrier(0, 1)
    tb.barrier(1, 1)
    r = simulate(tb.array())
    assert len(r.idle_gaps()) == 0
    g = r.idle_gaps(barriers=True)
    # core 0 reaches barrier 1 after its matmul; core 1 arrives at once and waits inside it
    assert len(g) == 1 and g["engine"][0] == Engine.BARRIER and g["core"][0] == 0


# ---- the pipelined bound's steps ---------------------------------------------------------
def test_flow_shop_makespan():
    from mlagen.backends.sc11.costmodel import flow_shop
    w = np.array([[2.0, 1.0, 1.0]] * 5)        # SDMA-bound: fill 2 + 1, then 2 a step
    assert flow_shop(w) == pytest.approx(2 * 5 + 1 + 1)
    w = np.array([[1.0, 1.0, 3.0]] * 4)        # compute-bound
    assert flow_shop(w) == pytest.approx(1 + 1 + 3 * 4)
    assert flow_shop(np.zeros((0, 3))) == 0.0


def test_steps_follow_loads_and_not_stores():
    from mlagen.backends.sc11.costmodel import step_work
    tb = TraceBuilder()
    prev_store = -1
    for _ in range(3):
        s = tb.dma(0, Engine.SDMA, Mem.DDR, Mem.L2, 1 << 16)
        g = tb.dma(0, Engine.GDMA, Mem.L2, Mem.LMEM, 1 << 16, deps=[s])
        q = tb.dma(0, Engine.GDMA, Mem.L2, Mem.LMEM, 4096)            # a second load
        a = tb.matmul(0, 32, 64, 576, deps=[g, q])
        # the result waits for the last store out of its slot (a WAR dependency on a DMA)
        b = tb.vector(0, 4096, deps=[a, prev_store])
        prev_store = tb.dma(0, Engine.GDMA, Mem.LMEM, Mem.L2, 4096, deps=[b])
    r = simulate(tb.array())
    w = step_work(r)[(0, 0)]
    assert w.shape == (4, 3)                  # 3 steps + the last store after them
    dur = r.end - r.start
    assert w[0, 0] == pytest.approx(dur[0])   # step 0's SDMA
    assert w[0, 1] == pytest.approx(dur[1] + dur[2])            # its two loads
    assert w[1, 1] == pytest.approx(dur[7] + dur[8] + dur[5])   # loads 1 + store 0
    assert w[3, 1] == pytest.approx(dur[17]) and w[3, 2] == 0   # the drain: last store
    assert w[:, 2].sum() == pytest.approx(sum(dur[i] for i in (3, 4, 9, 10, 15, 16)))
