"""The SC11 cost model: an event-driven simulation of an emulator trace (trace.py).

Every (core, engine) pair is an in-order queue.  An event starts when its queue is free and
every event it depends on has ended; it then takes

    BDC matmul   (ceil(n/lanes) * ceil(k/cube_ic) * ceil(m/cube_oc) + mm_startup + issue) cycles
                 (an fp32-operand matmul, elems == 4, has cube_ic / cube_fp32_slowdown)
    BDC vector   (ceil(elems / (lanes * fp32 per lane)) + issue) cycles
    BDC dequant  (ceil(elems / (lanes * fp8 conversions per lane)) + issue) cycles: 8-bit KV
                 values into the cube's 16-bit operands (elems = vector operations)
    DMA          latency(src, dst) + issue cycles + padded bytes / bandwidth
    BARRIER      all participating cores end together, barrier_s after the last one arrives

DMA bandwidth: a DMA that touches DDR is a *flow* that shares the chip's DDR bandwidth with
every other DDR flow active at the same moment (max-min fair: each flow gets at most its own
cap -- GDMA min(GDMA port, DDR per core), SDMA sdma_bw -- and the chip's ddr_bw_per_chip is
water-filled over them; rates are recomputed whenever a flow starts or ends).  DMAs between
L2 and LMEM run at min(GDMA port, l2_bw) and LMEM <-> LMEM at the GDMA port, unshared.
Two more shared resources per chip, each a group in the same max-min sharing: the SDMA
engines (sdma_engines_per_chip x sdma_bw over every SDMA flow; not binding with one per
core) and, when l2_bw_scope is "chip", the L2 port (l2_bw over every DMA touching L2: the
cores' GDMA L2 <-> LMEM and the SDMA gathers into L2).

A barrier is also a fence for its core: it waits for everything the core issued before it
(lower ids, every engine), and everything the core issues after it waits for the barrier.

docs/sc11-cost-model.md gives every formula and names the assumed parameters.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ...errors import EmulatorError
from ...targets import Target
from .. import load_target
from .trace import EVENT_DTYPE, MAX_DEPS, Engine, Mem, Op

ENGINES = tuple(Engine)
N_ENG = len(ENGINES)


# ---------------------------------------------------------------------------------------
# The machine, as the cost model sees it
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Machine:
    bdc_hz: float
    dma_hz: float
    lanes: int
    cube_ic: int
    cube_oc: int
    vec_fp32: int                 # fp32 elements per lane per cycle
    mm_startup: int               # cycles before a matmul's first result
    issue: int                    # cycles per instruction (BDC and DMA descriptors)
    ddr_bw_core: float            # B/s a core's GDMA may draw from DDR
    ddr_bw_chip: float            # B/s the chip's DDR serves in all
    l2_bw: float                  # B/s L2 <-> LMEM per core
    sdma_bw: float                # B/s per SDMA queue
    gdma_port: float              # B/s a GDMA port moves at most
    align: int                    # bytes a DMA piece is padded to
    latency: tuple                # seconds by Mem (NONE, DDR, L2, LMEM)
    barrier_s: float
    cores_per_chip: int
    sdma_engines: int = 8         # per chip; their bandwidth is shared by the cores' gathers
    l2_scope: str = "core"        # "core": l2_bw per core, unshared; "chip": one port shared
    #                               by every L2 DMA; "chip_gdma": shared by the GDMAs only
    cube_fp32_slowdown: int = 4   # an fp32-operand matmul runs at 1/this of the bf16 rate
    dequant_per_lane: int = 32    # 8-bit -> 16-bit conversions per lane per cycle
    descriptor_cycles: int = 16   # DMA cycles of one gather descriptor (a DMA's m)

    @classmethod
    def from_target(cls, t: Target) -> "Machine":
        return cls(
            bdc_hz=float(t.bdc_clock_hz), dma_hz=float(t.dma_clock_hz), lanes=int(t.lanes),
            cube_ic=int(t.cube_ic_per_lane), cube_oc=int(t.cube_oc_per_lane),
            vec_fp32=int(t.vector_bytes_per_lane) // 4, mm_startup=int(t.mm_startup_cycles),
            issue=int(t.issue_cycles), ddr_bw_core=float(t.ddr_bw_per_core),
            ddr_bw_chip=float(t.ddr_bw_per_chip), l2_bw=float(t.l2_bw),
            sdma_bw=float(t.sdma_bw),
            gdma_port=float(t.gdma_bytes_per_cycle) * float(t.dma_clock_hz),
            align=int(t.dma_align),
            latency=(0.0, float(t.ddr_latency_s), float(t.l2_latency_s),
                     float(t.lmem_latency_s)),
            barrier_s=float(t.barrier_s), cores_per_chip=int(t.cores_per_chip),
            sdma_engines=int(t.params.get("sdma_engines_per_chip", t.cores_per_chip)),
            l2_scope=str(t.params.get("l2_bw_scope", "core")),
            cube_fp32_slowdown=int(t.params.get("cube_fp32_slowdown", 1)),
            dequant_per_lane=int(t.params.get("fp8_convert_per_lane_cycle",
                                              int(t.vector_bytes_per_lane) // 2)),
            descriptor_cycles=int(t.params.get("dma_descriptor_cycles", 16)))

    def replace(self, **kw) -> "Machine":
        return dataclasses.replace(self, **kw)

    @property
    def peak_flops_core(self) -> float:
        return 2.0 * self.lanes * self.cube_ic * self.cube_oc * self.bdc_hz


def default_machine() -> Machine:
    return Machine.from_target(load_target("sc11"))


def _cdiv(a: np.ndarray, b: int) -> np.ndarray:
    return -(-a // b)


# ---------------------------------------------------------------------------------------
# Per-event costs that do not depend on other events (vectorised)
# ---------------------------------------------------------------------------------------
def event_costs(ev: np.ndarray, mc: Machine):
    """(fixed seconds, DDR-flow bytes, flow cap B/s) per event.

    fixed is the whole duration of an event that is not a DDR flow; for a DDR flow it is the
    part before the bytes move (latency + issue), and the bytes then move at the shared rate.
    """
    op, eng = ev["op"].astype(np.int64), ev["engine"].astype(np.int64)
    src, dst = ev["src"].astype(np.int64), ev["dst"].astype(np.int64)
    n = len(ev)
    fixed = np.zeros(n)
    flow_bytes = np.zeros(n)
    cap = np.full(n, np.inf)

    mm = op == Op.MATMUL
    if mm.any():
        m, nn, k = ev["m"][mm], ev["n"][mm], ev["k"][mm]
        ic = np.where(ev["elems"][mm] == 4, max(1, mc.cube_ic // mc.cube_fp32_slowdown),
                      mc.cube_ic)
        cyc = (_cdiv(nn, mc.lanes) * _cdiv(k, ic) * _cdiv(m, mc.cube_oc)
               + mc.mm_startup + mc.issue)
        fixed[mm] = cyc / mc.bdc_hz
    vec = op == Op.VECTOR
    if vec.any():
        fixed[vec] = (_cdiv(ev["elems"][vec], mc.lanes * mc.vec_fp32) + mc.issue) / mc.bdc_hz
    deq = op == Op.DEQUANT
    if deq.any():
        fixed[deq] = (_cdiv(ev["elems"][deq], mc.lanes * mc.dequant_per_lane) + mc.issue) \
            / mc.bdc_hz
    bar = op == Op.BARRIER
    fixed[bar] = mc.barrier_s

    dma = op == Op.DMA
    if dma.any():
        lat = np.asarray(mc.latency)
        s, d = src[dma], dst[dma]
        pieces = np.maximum(ev["aux"][dma], 1)
        nbytes = ev["bytes"][dma]
        # each contiguous piece is padded to the DMA alignment
        padded = pieces * _cdiv(_cdiv(nbytes, pieces), mc.align) * mc.align
        # a gather (the sparse path's SDMA) issues m descriptors (a run of adjacent slots each)
        pre = np.maximum(lat[s], lat[d]) + (mc.issue + ev["m"][dma] * mc.descriptor_cycles) \
            / mc.dma_hz
        touches_ddr = (s == Mem.DDR) | (d == Mem.DDR)
        touches_l2 = (s == Mem.L2) | (d == Mem.L2)
        is_sdma = eng[dma] == Engine.SDMA
        c = np.where(is_sdma, mc.sdma_bw,
                     np.where(touches_ddr, min(mc.gdma_port, mc.ddr_bw_core),
                              np.where(touches_l2, min(mc.gdma_port, mc.l2_bw),
                                       mc.gdma_port)))
        # a flow shares some chip resource: DDR, the SDMA engines, or a chip-wide L2 port
        shared = touches_ddr | is_sdma | (touches_l2 & (mc.l2_scope != "core"))
        fd = np.where(shared, padded, 0).astype(float)
        fixed[dma] = pre + np.where(shared, 0.0, padded / c)
        flow_bytes[dma] = fd
        cap[dma] = c
    return fixed, flow_bytes, cap


def _check(ev: np.ndarray) -> None:
    if ev.dtype != EVENT_DTYPE:
        raise EmulatorError(f"trace has dtype {ev.dtype}, expected trace.EVENT_DTYPE")
    bad = ~np.isin(ev["engine"], [int(e) for e in Engine])
    if bad.any():
        raise EmulatorError(f"event id {ev['id'][bad][0]}: unknown engine {ev['engine'][bad][0]}")
    sd = (ev["engine"] == Engine.SDMA) & (ev["op"] == Op.DMA)
    wrong = sd & ~(np.isin(ev["src"], [Mem.DDR, Mem.L2]) & np.isin(ev["dst"], [Mem.DDR, Mem.L2]))
    if wrong.any():
        raise EmulatorError(f"event id {ev['id'][wrong][0]}: SDMA moves only between DDR and L2")
    openg = {Op.DMA: (Engine.SDMA, Engine.GDMA), Op.MATMUL: (Engine.BDC,),
             Op.VECTOR: (Engine.BDC,), Op.DEQUANT: (Engine.BDC,),
             Op.BARRIER: (Engine.BARRIER,)}
    for o, engs in openg.items():
        sel = (ev["op"] == o) & ~np.isin(ev["engine"], [int(e) for e in engs])
        if sel.any():
            raise EmulatorError(f"event id {ev['id'][sel][0]}: op {o.name} on engine "
                                f"{ev['engine'][sel][0]}")
    if (ev["bytes"] < 0).any() or (ev["m"] < 0).any() or (ev["elems"] < 0).any():
        raise EmulatorError("trace has negative sizes")


# ---------------------------------------------------------------------------------------
# The result
# ---------------------------------------------------------------------------------------
@dataclass
class SimResult:
    events: np.ndarray            # the trace, sorted by id
    start: np.ndarray             # seconds, per event (same order as `events`)
    end: np.ndarray
    machine: Machine
    total_s: float
    cores: np.ndarray             # the cores that appear in the trace
    busy: dict = field(default_factory=dict)      # (core, Engine) -> busy seconds
    ddr_bytes: int = 0
    flops: int = 0
    barriers: int = 0

    # ---- bounds --------------------------------------------------------------------
    @property
    def chips(self) -> int:
        return max(1, -(-len(self.cores) // self.machine.cores_per_chip))

    @property
    def ddr_bound_s(self) -> float:
        return self.ddr_bytes / (self.machine.ddr_bw_chip * self.chips)

    @property
    def compute_bound_s(self) -> float:
        return self.flops / (self.machine.peak_flops_core * max(1, len(self.cores)))

    @property
    def bound_s(self) -> float:
        """max(DDR bytes / chip DDR bandwidth, FLOPs / peak of the cores used)."""
        return max(self.ddr_bound_s, self.compute_bound_s)

    @property
    def bound_ratio(self) -> float:
        return self.total_s / self.bound_s if self.bound_s > 0 else math.inf

    def busy_share(self, core: int, engine: Engine) -> float:
        return self.busy.get((core, Engine(engine)), 0.0) / self.total_s if self.total_s else 0.0

    def engine_share(self) -> dict:
        """Engine -> (mean, max) busy share over the cores."""
        out = {}
        for e in ENGINES:
            v = [self.busy_share(int(c), e) for c in self.cores]
            out[e] = (float(np.mean(v)), float(np.max(v)))
        return out

    def dominant_engine(self) -> Engine:
        """The compute or DMA engine with the highest busy share on its busiest core."""
        sh = self.engine_share()
        return max((Engine.SDMA, Engine.GDMA, Engine.BDC), key=lambda e: sh[e][1])

    def idle_gaps(self, min_s: float = 0.0, barriers: bool = False) -> np.ndarray:
        """Gaps inside each (core, engine) queue, between its first start and last end:
        a structured array of (core, engine, start, end) with end - start > min_s.  The
        barrier queue's gaps (the phases between barriers) only with ``barriers``."""
        ev = self.events
        keep = np.ones(len(ev), bool) if barriers else ev["engine"] != Engine.BARRIER
        key = (ev["core"].astype(np.int64) * N_ENG + ev["engine"])[keep]
        idx = np.nonzero(keep)[0]
        order = np.lexsort((ev["id"][idx], key))
        k, s, e = key[order], self.start[idx][order], self.end[idx][order]
        gap = s[1:] - e[:-1]            # an in-order queue: ends are monotone
        sel = np.nonzero((k[1:] == k[:-1]) & (gap > min_s))[0]
        out = np.zeros(len(sel), dtype=[("core", "i4"), ("engine", "i4"), ("start", "f8"),
                                        ("end", "f8")])
        out["core"], out["engine"] = k[sel] // N_ENG, k[sel] % N_ENG
        out["start"], out["end"] = e[sel], s[sel + 1]
        return out

    def phase_spans(self) -> dict:
        """phase -> (first start, last end) over all cores."""
        out = {}
        for ph in np.unique(self.events["phase"]):
            sel = self.events["phase"] == ph
            out[int(ph)] = (float(self.start[sel].min()), float(self.end[sel].max()))
        return out

    def pipelined_bound_s(self) -> float:
        return pipelined_bound(self)


# ---------------------------------------------------------------------------------------
# The simulation
# ---------------------------------------------------------------------------------------
def _water_fill(caps: list, total: float) -> list:
    """Max-min fair shares of `total` among flows capped at `caps`."""
    if sum(caps) <= total:
        return list(caps)
    order = sorted(range(len(caps)), key=caps.__getitem__)
    rates = [0.0] * len(caps)
    left, k = total, len(caps)
    for j, i in enumerate(order):
        share = left / (k - j)
        r = caps[i] if caps[i] < share else share
        rates[i] = r
        left -= r
    return rates


def _max_min(caps: list, groups: list) -> list:
    """Max-min fair rates for flows capped at `caps` that also share `groups`, a list of
    (capacity, member indices): progressive filling, every unfrozen flow rising together
    until its cap or one of its groups is full."""
    n = len(caps)
    # a group that can serve all its members' caps never binds
    groups = [g for g in groups if g[0] < sum(caps[i] for i in g[1]) * (1 - 1e-12)]
    if not groups:
        return list(caps)
    if len(groups) == 1 and len(groups[0][1]) == n:
        return _water_fill(caps, groups[0][0])
    rates = [0.0] * n
    frozen = [False] * n
    left = [g[0] for g in groups]
    while not all(frozen):
        inc = min(caps[i] - rates[i] for i in range(n) if not frozen[i])
        for gi, (cap_g, mem) in enumerate(groups):
            k = sum(1 for i in mem if not frozen[i])
            if k:
                inc = min(inc, left[gi] / k)
        inc = max(inc, 0.0)
        for i in range(n):
            if not frozen[i]:
                rates[i] += inc
        for gi, (cap_g, mem) in enumerate(groups):
            left[gi] -= inc * sum(1 for i in mem if not frozen[i])
        for i in range(n):
            if not frozen[i] and rates[i] >= caps[i] * (1 - 1e-12):
                frozen[i] = True
        for gi, (cap_g, mem) in enumerate(groups):
            if left[gi] <= cap_g * 1e-12:
                for i in mem:
                    frozen[i] = True
    return rates


def simulate(trace: np.ndarray, machine: Optional[Machine] = None) -> SimResult:
    """Simulate a trace (EVENT_DTYPE array) and return its timeline."""
    mc = machine or default_machine()
    ev0 = np.asarray(trace)
    _check(ev0)
    ev = ev0[np.argsort(ev0["id"], kind="stable")]
    n = len(ev)
    if n == 0:
        return SimResult(ev, np.zeros(0), np.zeros(0), mc, 0.0, np.zeros(0, np.int32))
    ids = ev["id"]
    if (ids[1:] == ids[:-1]).any():
        raise EmulatorError("trace has duplicate event ids")
    fixed, flow_bytes, cap = event_costs(ev, mc)

    # deps -> indices
    deps = ev["deps"]
    valid = deps >= 0
    pos = np.searchsorted(ids, np.where(valid, deps, ids[0]))
    pos = np.minimum(pos, n - 1)
    found = valid & (ids[pos] == np.where(valid, deps, -1))
    if (valid & ~found).any():
        i = np.nonzero((valid & ~found).any(axis=1))[0][0]
        raise EmulatorError(f"event id {ids[i]} depends on an id not in the trace: {deps[i]}")
    later = found & (pos >= np.arange(n)[:, None])
    if later.any():
        i = np.nonzero(later.any(axis=1))[0][0]
        raise EmulatorError(f"event id {ids[i]} depends on itself or a later event: {deps[i]}")

    core = ev["core"].astype(np.int64)
    eng = ev["engine"].astype(np.int64)
    cores = np.unique(core)
    qkey = core * N_ENG + eng
    rows, cols = np.nonzero(found)
    pairs_a, pairs_b = [rows], [pos[rows, cols]]          # (event, the event it waits for)

    # barriers are fences for their core
    is_bar = ev["op"] == Op.BARRIER
    bar_idx = np.nonzero(is_bar)[0]
    members: dict = {}
    if len(bar_idx):
        extra_a, extra_b = [], []
        for c in np.unique(core[bar_idx]):
            on_core = np.nonzero(core == c)[0]
            # the barrier queue orders barriers among themselves; fence the other queues
            queues = [on_core[eng[on_core] == e] for e in ENGINES if e != Engine.BARRIER]
            for b in bar_idx[core[bar_idx] == c]:
                for q in queues:
                    j = int(np.searchsorted(q, b))
                    if j > 0:                   # the last event before it, on this queue
                        extra_a.append(b)
                        extra_b.append(int(q[j - 1]))
                    if j < len(q):              # the first event after it
                        extra_a.append(int(q[j]))
                        extra_b.append(b)
        pairs_a.append(np.array(extra_a, np.int64))
        pairs_b.append(np.array(extra_b, np.int64))
        for b, a in zip(bar_idx, ev["aux"][bar_idx]):
            members.setdefault(int(a), []).append(int(b))
        for a, mem in members.items():
            cs = core[mem]
            if len(np.unique(cs)) != len(cs):
                raise EmulatorError(f"barrier {a} appears twice on core "
                                    f"{int(cs[np.argmax(np.bincount(cs))])}")
    pa, pb = np.concatenate(pairs_a), np.concatenate(pairs_b)
    uniq = np.unique(pb * n + pa)                         # sorted by the waited-for event
    pb, pa = uniq // n, uniq % n
    ndeps = np.bincount(pa, minlength=n).tolist()
    dep_ptr = np.searchsorted(pb, np.arange(n + 1)).tolist()
    dep_of = pa.tolist()                                  # dependents of i: dep_of[ptr[i]:ptr[i+1]]

    # queues
    order = np.lexsort((np.arange(n), qkey))
    qs = qkey[order]
    bounds = np.nonzero(np.r_[True, qs[1:] != qs[:-1], True])[0]
    nxt = [-1] * n                      # next event in the same queue
    queue_head = {}
    for a, b in zip(bounds[:-1], bounds[1:]):
        qidx = order[a:b].tolist()
        queue_head[int(qs[a])] = qidx[0]
        for x, y in zip(qidx[:-1], qidx[1:]):
            nxt[x] = y
    at_head = [False] * n
    for h in queue_head.values():
        at_head[h] = True

    fixed_l = fixed.tolist()
    fbytes = flow_bytes.tolist()
    cap_l = cap.tolist()
    bar_aux = {int(b): int(a) for b, a in zip(bar_idx, ev["aux"][bar_idx])}
    arrived: dict = {a: [] for a in members}
    start = [math.nan] * n
    end = [math.nan] * n

    heap: list = []                      # (time, seq, kind, event); kind 0 end, 1 flow begin
    seq = 0
    # active DDR flows
    flows: dict = {}                     # event -> [remaining bytes, rate]
    t_upd = 0.0
    # the shared resources a flow belongs to: (kind, chip) -> capacity
    chip_of = (core // mc.cores_per_chip).tolist()
    srcl, dstl = ev["src"].tolist(), ev["dst"].tolist()
    eng_l = eng.tolist()
    group_cap = {"ddr": mc.ddr_bw_chip, "sdma": mc.sdma_engines * mc.sdma_bw, "l2": mc.l2_bw}

    # with one SDMA queue per core and at least as many engines, and L2 per core, only DDR
    # is shared: the plain water-filling of one group per chip (the common, fast case)
    only_ddr = mc.sdma_engines >= mc.cores_per_chip and mc.l2_scope == "core"
    one_chip = len(set(chip_of)) == 1
    gcache: dict = {}

    def groups_of(i: int) -> list:
        if i in gcache:
            return gcache[i]
        g = gcache[i] = []
        if Mem.DDR in (srcl[i], dstl[i]):
            g.append(("ddr", chip_of[i]))
        if eng_l[i] == Engine.SDMA:
            g.append(("sdma", chip_of[i]))
        if Mem.L2 in (srcl[i], dstl[i]) and (
                mc.l2_scope == "chip" or (mc.l2_scope == "chip_gdma" and eng_l[i] == Engine.GDMA)):
            g.append(("l2", chip_of[i]))
        return g

    def launch(i: int, now: float) -> None:
        nonlocal seq
        start[i] = now
        if i in bar_aux:
            a = bar_aux[i]
            arrived[a].append(i)
            if len(arrived[a]) == len(members[a]):
                for j in arrived[a]:
                    heapq.heappush(heap, (now + fixed_l[j], seq, 0, j))
                    seq += 1
            return
        kind = 1 if fbytes[i] > 0 else 0
        heapq.heappush(heap, (now + fixed_l[i], seq, kind, i))
        seq += 1

    def finish(i: int, now: float) -> None:
        end[i] = now
        j = nxt[i]
        if j >= 0:
            at_head[j] = True
            if ndeps[j] == 0:
                launch(j, now)
        for j in dep_of[dep_ptr[i]:dep_ptr[i + 1]]:
            ndeps[j] -= 1
            if ndeps[j] == 0 and at_head[j]:
                launch(j, now)

    def settle(now: float) -> None:
        nonlocal t_upd
        dt = now - t_upd
        if dt > 0:
            for f in flows.values():
                f[0] -= f[1] * dt
        t_upd = now

    def rerate():
        """New shares after the set of flows changed; returns the next flow to end."""
        best, bi = math.inf, -1
        if flows and only_ddr and one_chip:
            keys = list(flows)
            rates = _water_fill([cap_l[k] for k in keys], mc.ddr_bw_chip)
            for k, r in zip(keys, rates):
                f = flows[k]
                f[1] = r
                t = t_upd + max(f[0], 0.0) / r
                if t < best:
                    best, bi = t, k
        elif flows:
            keys = list(flows)
            gm: dict = {}
            for j, k in enumerate(keys):
                for g in groups_of(k):
                    gm.setdefault(g, []).append(j)
            rates = _max_min([cap_l[k] for k in keys],
                             [(group_cap[g[0]], m) for g, m in gm.items()])
            for k, r in zip(keys, rates):
                f = flows[k]
                f[1] = r
                t = t_upd + max(f[0], 0.0) / r
                if t < best:
                    best, bi = t, k
        return best, bi

    for h in queue_head.values():
        if ndeps[h] == 0:
            launch(h, 0.0)

    now = 0.0
    tf, fi = math.inf, -1
    while heap or flows:
        th = heap[0][0] if heap else math.inf
        if fi >= 0 and tf <= th:
            now = tf
            settle(now)
            done = [k for k, (rem, r) in flows.items() if rem <= r * 1e-12 + 1e-6]
            if fi not in done:
                done.append(fi)
            for k in done:
                del flows[k]
            tf, fi = rerate()
            for k in done:
                finish(k, now)
        else:
            now, _, kind, i = heapq.heappop(heap)
            if kind == 1:
                settle(now)
                flows[i] = [fbytes[i], 0.0]
                tf, fi = rerate()
            else:
                finish(i, now)

    start_a, end_a = np.array(start), np.array(end)
    if np.isnan(end_a).any():
        i = int(np.nonzero(np.isnan(end_a))[0][0])
        raise EmulatorError(
            f"trace deadlocks: event id {ids[i]} (core {core[i]}, {Engine(eng[i]).name}) never "
            f"runs; {int(np.isnan(end_a).sum())} events stuck (a dependency cycle, or a barrier "
            f"some core never reaches)")

    dur = end_a - start_a
    busy = {}
    for c in cores:
        for e in ENGINES:
            sel = (core == c) & (eng == e)
            if sel.any():
                busy[(int(c), e)] = float(dur[sel].sum())
    is_ddr = (ev["op"] == Op.DMA) & ((ev["src"] == Mem.DDR) | (ev["dst"] == Mem.DDR))
    mmsel = ev["op"] == Op.MATMUL
    flops = int((2 * ev["m"][mmsel] * ev["n"][mmsel] * ev["k"][mmsel]).sum())
    return SimResult(ev, start_a, end_a, mc, float(end_a.max()), cores, busy,
                     ddr_bytes=int(ev["bytes"][is_ddr].sum()), flops=flops,
                     barriers=len(members))


# ---------------------------------------------------------------------------------------
# The pipelined bound
# ---------------------------------------------------------------------------------------
def _csr(ev: np.ndarray):
    """deps and dependents of a sorted trace as python lists (index based)."""
    n = len(ev)
    ids, deps = ev["id"], ev["deps"]
    valid = deps >= 0
    pos = np.minimum(np.searchsorted(ids, np.where(valid, deps, ids[0])), n - 1)
    rows, cols = np.nonzero(valid)
    waited = pos[rows, cols]
    dptr = np.searchsorted(rows, np.arange(n + 1)).tolist()
    order = np.argsort(waited, kind="stable")
    ws, rs = waited[order], rows[order]
    optr = np.searchsorted(ws, np.arange(n + 1)).tolist()
    return waited.tolist(), dptr, rs.tolist(), optr


def step_work(sim: SimResult) -> dict:
    """{(core, segment): array [steps, 3] of SDMA, GDMA, BDC seconds per pipeline step}.

    Each core's trace is cut at its barriers into segments.  A *load* is a DMA into LMEM that
    a BDC event waits for, or a DMA whose destination a load reads (the SDMA gather into L2
    before the GDMA L2 -> LMEM); the *first hop* of a chain is the load that reads what no
    earlier DMA of the chain wrote.  A *step* begins at a BDC event that waits for a load
    whose first hop no earlier BDC event consumed.  A load counts in the step that first
    needs it, a store (any other DMA after BDC work) in the step after the one that fed it
    (when an ideal pipeline does it), a BDC event in its step.  Durations are the simulated
    ones, so each DMA's share of DDR is the one the simulation found.
    """
    ev, dur = sim.events, (sim.end - sim.start).tolist()
    n = len(ev)
    if n == 0:
        return {}
    dep, dptr, dpd, optr = _csr(ev)
    eng = ev["engine"].astype(np.int64).tolist()
    core = ev["core"].astype(np.int64).tolist()
    src = ev["src"].astype(np.int64).tolist()
    dst = ev["dst"].astype(np.int64).tolist()
    BDC, BAR, LMEM = int(Engine.BDC), int(Engine.BARRIER), int(Mem.LMEM)

    seg = [0] * n
    seen: dict = {}
    for i in range(n):
        c = core[i]
        if eng[i] == BAR:
            seen[c] = seen.get(c, 0) + 1
        seg[i] = seen.get(c, 0)

    def same(i, j):
        return core[i] == core[j] and seg[i] == seg[j]

    # loads and the step that first needs them: dependents have higher ids, so go backwards
    # (steps of BDC events are not known yet: first mark loads, number steps, then need)
    is_load = [False] * n
    for i in range(n - 1, -1, -1):
        if eng[i] >= BDC:
            continue
        for j in dpd[optr[i]:optr[i + 1]]:
            if not same(i, j):
                continue
            if (eng[j] == BDC and dst[i] == LMEM) or (eng[j] < BDC and is_load[j]
                                                      and src[j] == dst[i]):
                is_load[i] = True
                break
    root = list(range(n))
    for i in range(n):
        if is_load[i]:
            for d in dep[dptr[i]:dptr[i + 1]]:
                if is_load[d] and dst[d] == src[i] and same(i, d):
                    root[i] = root[d]
                    break

    step = [0] * n
    cur: dict = {}
    consumed = [False] * n
    for i in range(n):
        if eng[i] != BDC:
            continue
        key = (core[i], seg[i])
        new = False
        for d in dep[dptr[i]:dptr[i + 1]]:
            if is_load[d] and dst[d] == LMEM and same(i, d) and not consumed[root[d]]:
                consumed[root[d]] = True
                new = True
        st = cur.get(key)
        st = 0 if st is None else st + new
        cur[key] = st
        step[i] = st

    for i in range(n - 1, -1, -1):           # loads: the first step that needs them
        if not is_load[i]:
            continue
        best = None
        for j in dpd[optr[i]:optr[i + 1]]:
            if not same(i, j):
                continue
            if eng[j] == BDC and dst[i] == LMEM:
                s_ = step[j]
            elif eng[j] < BDC and is_load[j] and src[j] == dst[i]:
                s_ = step[j]
            else:
                continue
            if best is None or s_ < best:
                best = s_
        step[i] = best
    for i in range(n):                         # stores: after the step that fed them
        if eng[i] >= BDC or is_load[i]:
            continue
        best = 0
        for d in dep[dptr[i]:dptr[i + 1]]:
            if same(i, d) and eng[d] != BAR:
                best = max(best, step[d] + 1 if eng[d] == BDC else step[d])
        step[i] = best

    out: dict = {}
    for i in range(n):
        if eng[i] == BAR:
            continue
        key = (core[i], seg[i])
        lst = out.setdefault(key, {})
        w = lst.get(step[i])
        if w is None:
            w = lst[step[i]] = [0.0, 0.0, 0.0]
        w[eng[i]] += dur[i]
    res = {}
    for key, lst in out.items():
        arr = np.zeros((max(lst) + 1, 3))
        for st, w in lst.items():
            arr[st] = w
        res[key] = arr
    return res


def flow_shop(work: np.ndarray) -> float:
    """Makespan of steps through the stages SDMA -> GDMA -> BDC, one engine per stage,
    unlimited buffers:  C[e][i] = max(C[e-1][i], C[e][i-1]) + work[i][e].  With one stage
    dominating it is fill + sum over steps of max(compute_i, dma_i) + drain."""
    c = [0.0, 0.0, 0.0]
    for row in work.tolist():
        prev = 0.0
        for e in range(3):
            t = max(prev, c[e]) + row[e]
            c[e] = prev = t
    return c[2] if work.size else 0.0


def pipelined_bound(sim: SimResult, detail: bool = False):
    """The ideal pipelined time: per segment between barriers the slowest core's flow-shop
    makespan of its steps (step_work), summed over segments, plus barrier_s per barrier.
    ``detail`` also returns step_work's table."""
    work = step_work(sim)
    seg_cost: dict = {}
    for (c, s_), w in work.items():
        seg_cost[s_] = max(seg_cost.get(s_, 0.0), flow_shop(w))
    total = float(sum(seg_cost.values()) + sim.barriers * sim.machine.barrier_s)
    return (total, work) if detail else total


# ---------------------------------------------------------------------------------------
# Building traces by hand (tests, docs, what-if studies)
# ---------------------------------------------------------------------------------------
class TraceBuilder:
    """Append events and get an EVENT_DTYPE array; each call returns the new event's id."""

    def __init__(self):
        self.rows: list = []

    def _add(self, core, engine, op, src=Mem.NONE, dst=Mem.NONE, phase=0, nbytes=0, m=0, n=0,
             k=0, elems=0, aux=0, deps=()):
        deps = [int(d) for d in deps if d is not None and d >= 0]
        if len(deps) > MAX_DEPS:
            raise ValueError(f"at most {MAX_DEPS} deps per event")
        i = len(self.rows)
        self.rows.append((i, core, int(engine), int(op), int(src), int(dst), phase, nbytes, m, n,
                          k, elems, aux, tuple(deps + [-1] * (MAX_DEPS - len(deps)))))
        return i

    def dma(self, core, engine, src, dst, nbytes, deps=(), phase=1, pieces=1):
        return self._add(core, engine, Op.DMA, src, dst, phase, nbytes=nbytes, aux=pieces,
                         deps=deps)

    def matmul(self, core, m, n, k, deps=(), phase=1, fp32=False):
        return self._add(core, Engine.BDC, Op.MATMUL, phase=phase, m=m, n=n, k=k,
                         elems=4 if fp32 else 0, deps=deps)

    def vector(self, core, elems, deps=(), phase=1):
        return self._add(core, Engine.BDC, Op.VECTOR, phase=phase, elems=elems, deps=deps)

    def barrier(self, core, number, deps=(), phase=1):
        return self._add(core, Engine.BARRIER, Op.BARRIER, phase=phase, aux=number, deps=deps)

    def array(self) -> np.ndarray:
        return np.array(self.rows, dtype=EVENT_DTYPE)
