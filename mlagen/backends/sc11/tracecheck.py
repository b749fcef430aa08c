"""Invariants of an SC11 trace, checked from the trace alone (tests and the verifier).

Happens-before is what the card guarantees: an event starts after its deps and after the
previous event of its own (core, engine) queue.  From that:

* ids are 0..n-1 and deps point at earlier events (so id order is a valid schedule);
* every barrier number has one event per core;
* phase B multi-buffer (reconstructed per core in issue order): the BDC work of step k
  happens after the GDMA that moved step k's tile into LMEM, which happens after the SDMA
  gather of step k into L2; and the SDMA / GDMA of step k happen after the BDC work of
  step k - buffers that last used the same slots (no DMA into a slot in use);
* phases A and C (check_projection) and the merge (check_merge), the same way: loads
  before the BDC work that reads them, BDC output before its store, no refill of a slot
  before its previous reader is done;
* across barriers (check_across_phases): a phase's L2 writes before the next phases'
  L2 reads on every core.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .trace import Engine, Mem, Op


@dataclass
class Steps:
    """Phase B steps of one core: event ids per step."""
    sdma: list[int]
    gdma: list[int]       # the KV tile's L2 -> LMEM copy
    bdc_first: list[int]  # first BDC event reading the tile
    bdc_last: list[int]   # last BDC event reading the tile


class HappensBefore:
    """Reachability in the trace's dependency graph plus per-queue order."""

    def __init__(self, trace: np.ndarray):
        self.trace = trace
        cores = int(trace["core"].max()) + 1 if len(trace) else 1
        self.nq = cores * 4
        self.queue = trace["core"].astype(np.int64) * 4 + trace["engine"]
        # anc[e, q]: the latest event of queue q that happens before or at e (-1: none)
        anc = np.full((len(trace), self.nq), -1, dtype=np.int64)
        last = np.full(self.nq, -1, dtype=np.int64)
        # a barrier ends on every core together: each member ends after every member's
        # arrival (the emulator appends a barrier's members one after another)
        is_bar = trace["engine"] == Engine.BARRIER
        members: dict = {}
        for i in np.nonzero(is_bar)[0].tolist():
            members.setdefault(int(trace["aux"][i]), []).append(i)
        joined: dict = {}
        for i in range(len(trace)):
            q = self.queue[i]
            row = anc[last[q]].copy() if last[q] >= 0 else np.full(self.nq, -1, np.int64)
            for d in trace["deps"][i]:
                if d >= 0:
                    np.maximum(row, anc[d], out=row)
            row[q] = i
            if is_bar[i]:
                group = members[int(trace["aux"][i])]
                if i == group[0]:
                    joined[group[0]] = row
                    for j in group[1:]:
                        if any(d >= group[0] for d in trace["deps"][j] if d >= 0):
                            break       # not a contiguous barrier: join what we can
                        qj = self.queue[j]
                        rj = anc[last[qj]].copy() if last[qj] >= 0 else \
                            np.full(self.nq, -1, np.int64)
                        for d in trace["deps"][j]:
                            if d >= 0:
                                np.maximum(rj, anc[d], out=rj)
                        rj[qj] = j
                        np.maximum(row, rj, out=row)
                else:
                    np.maximum(row, joined[group[0]], out=row)
            anc[i] = row
            last[q] = i
        self.anc = anc

    def before(self, a: int, b: int) -> bool:
        """Event a happens before (or is) event b."""
        return self.anc[b, self.queue[a]] >= a


def check_basic(trace: np.ndarray) -> list[str]:
    errs = []
    n = len(trace)
    if not np.array_equal(trace["id"], np.arange(n)):
        errs.append("event ids are not 0..n-1 in order")
    deps = trace["deps"]
    bad = (deps >= trace["id"][:, None]) | (deps < -1)
    if bad.any():
        errs.append(f"{int(bad.any(axis=1).sum())} events depend on a later event or a bad id")
    bar = trace[trace["engine"] == Engine.BARRIER]
    cores = set(np.unique(trace["core"]).tolist())
    for number in np.unique(bar["aux"]):
        who = set(bar["core"][bar["aux"] == number].tolist())
        if who != cores:
            errs.append(f"barrier {number} misses cores {sorted(cores - who)}")
    return errs


def phase_b_steps(trace: np.ndarray, core: int, d_bytes: int) -> Steps:
    """Reconstruct one core's phase B steps (issue order = id order within a queue)."""
    t = trace[(trace["core"] == core) & (trace["phase"] == 2)]
    sdma = t["id"][(t["engine"] == Engine.SDMA)].tolist()
    g = t[(t["engine"] == Engine.GDMA) & (t["src"] == Mem.L2) & (t["dst"] == Mem.LMEM)]
    sset = set(sdma)   # the tile load waits for its gather (a q load from L2 does not)
    gdma = [int(e["id"]) for e in g if any(int(x) in sset for x in e["deps"])]
    bdc = t[t["engine"] == Engine.BDC]
    first, last = [], []
    gset = set(gdma)
    cur_last = None
    for e in bdc:
        # a step's first BDC event: Q K^T, or the dequantization of an 8-bit tile before it
        is_qk = (e["op"] == Op.MATMUL and e["k"] * 2 == d_bytes) or e["op"] == Op.DEQUANT
        if is_qk and any(int(x) in gset for x in e["deps"]):
            if cur_last is not None:
                last.append(cur_last)
            first.append(int(e["id"]))
            cur_last = int(e["id"])
        elif first and e["op"] in (Op.MATMUL, Op.VECTOR, Op.DEQUANT) and cur_last is not None:
            if e["op"] == Op.MATMUL:
                cur_last = int(e["id"])
    if cur_last is not None:
        last.append(cur_last)
    return Steps(sdma, gdma, first, last)


def check_buffers(trace: np.ndarray, buffers: int, d: int,
                  hb: HappensBefore | None = None) -> list[str]:
    """The multi-buffer protocol, seen in the trace (see the module doc)."""
    hb = hb or HappensBefore(trace)
    errs = []
    for core in np.unique(trace["core"]).tolist():
        st = phase_b_steps(trace, core, d * 2)
        n = len(st.sdma)
        if not (len(st.gdma) == len(st.bdc_first) == len(st.bdc_last) == n):
            errs.append(f"core {core}: {n} gathers, {len(st.gdma)} tile loads, "
                        f"{len(st.bdc_first)} compute steps")
            continue
        for k in range(n):
            if not hb.before(st.sdma[k], st.gdma[k]):
                errs.append(f"core {core} step {k}: GDMA may start before its SDMA gather")
            if not hb.before(st.gdma[k], st.bdc_first[k]):
                errs.append(f"core {core} step {k}: BDC may read the tile before its GDMA ends")
            if k >= buffers:
                prev = st.bdc_last[k - buffers]
                if not hb.before(prev, st.sdma[k]):
                    errs.append(f"core {core} step {k}: SDMA into an L2 slot still in use")
                if not hb.before(prev, st.gdma[k]):
                    errs.append(f"core {core} step {k}: GDMA into an LMEM slot still in use")
    return errs


def _segments(trace: np.ndarray) -> np.ndarray:
    """Per event: how many barriers its core passed before it (its barrier segment)."""
    seg = np.zeros(len(trace), np.int64)
    bar = trace["engine"] == Engine.BARRIER
    for c in np.unique(trace["core"]):
        on = trace["core"] == c
        seg[on] = np.cumsum(bar[on]) - bar[on]
    return seg


def _need(errs: list, hb: HappensBefore, a: int, b: int, what: str) -> None:
    if not hb.before(a, b):
        errs.append(what)


def check_projection(trace: np.ndarray, phase: int, hb: HappensBefore) -> list[str]:
    """Phase A (1) or C (4), per core in issue order.  Item i = one (row chunk, head): its
    weight load(s) and input load happen before its first matmul, its BDC output before its
    store; slots (2 of each) are refilled only after the item two back used them."""
    errs = []
    seg = _segments(trace)
    for core in np.unique(trace["core"]).tolist():
        on = trace["core"] == core
        ph = on & (trace["phase"] == phase)
        if not ph.any():
            continue
        segment = int(seg[ph].min())
        t_seg = on & (seg == segment) & (trace["engine"] != Engine.BARRIER)
        t = trace[t_seg]
        g, b = t[t["engine"] == Engine.GDMA], t[t["engine"] == Engine.BDC]
        weights = g["id"][(g["phase"] == 0) & (g["src"] == Mem.DDR)].tolist()
        mm = b[b["op"] == Op.MATMUL]
        vec = b["id"][b["op"] == Op.VECTOR].tolist()
        if phase == 1:      # q = x W_UQ, q_lat = q_nope W_UK, RoPE + rounding (vector)
            first = mm["id"][0::2].tolist()
            per_item_w = 2
            inputs = g["id"][(g["phase"] == 1) & (g["src"] == Mem.DDR)].tolist()
            stores = g["id"][(g["dst"] == Mem.L2)].tolist()
        else:               # out = o_lat W_UV (matmul), rounding (vector)
            first = mm["id"].tolist()
            per_item_w = 1
            inputs = g["id"][(g["src"] == Mem.L2)].tolist()
            stores = g["id"][(g["dst"] == Mem.DDR)].tolist()
        n = len(first)
        if not (len(vec) == len(stores) == n and len(weights) == per_item_w * n and inputs):
            errs.append(f"phase {phase} core {core}: {n} items, {len(weights)} weight loads, "
                        f"{len(vec)} outputs, {len(stores)} stores, {len(inputs)} inputs")
            continue
        per_chunk = n // len(inputs) if phase == 1 else 1
        if phase == 1 and per_chunk * len(inputs) != n:
            errs.append(f"phase A core {core}: {n} items over {len(inputs)} row chunks")
            continue
        for i in range(n):
            w = weights[per_item_w * i: per_item_w * (i + 1)]
            where = f"phase {phase} core {core} item {i}"
            for x in w:
                _need(errs, hb, x, first[i], f"{where}: matmul may start before its weights")
            _need(errs, hb, inputs[i // per_chunk], first[i],
                  f"{where}: matmul may start before its input rows")
            _need(errs, hb, vec[i], stores[i], f"{where}: store may start before BDC wrote it")
            if i >= 2:
                _need(errs, hb, vec[i - 2], w[0],
                      f"{where}: weight load into a slot still being read")
                _need(errs, hb, stores[i - 2], first[i],
                      f"{where}: BDC output into a slot still being stored")
            j = i // per_chunk
            if i % per_chunk == 0 and j >= 2:
                _need(errs, hb, vec[(j - 1) * per_chunk - 1], inputs[j],
                      f"{where}: input load into a slot still being read")
    return errs


def check_merge(trace: np.ndarray, hb: HappensBefore) -> list[str]:
    """The merge, per core in issue order: partial j's load happens before its fold; a load
    refills a slot (2) only after the fold two back; each merged result is written by BDC
    before its store, and the out slot (1) is rewritten only after the previous store."""
    errs = []
    for core in np.unique(trace["core"]).tolist():
        t = trace[(trace["core"] == core) & (trace["phase"] == 3)]
        if not len(t):
            continue
        # the partials' loads (L2 -> LMEM; a sparse merge's sinks come from DDR beside them)
        loads = t["id"][(t["engine"] == Engine.GDMA) & (t["src"] == Mem.L2)
                        & (t["dst"] == Mem.LMEM)].tolist()
        v = t[(t["engine"] == Engine.BDC) & (t["op"] == Op.VECTOR)]
        if not len(v):
            continue
        big = v["elems"].max()
        folds = v["id"][v["elems"] == big].tolist()
        finals = v["id"][v["elems"] != big].tolist()
        g = t[(t["engine"] == Engine.GDMA) & (t["src"] == Mem.LMEM)]
        stores = g["id"][g["bytes"] != g["bytes"].min()].tolist() if len(g) else []
        if len(loads) != len(folds) or len(stores) != len(finals):
            errs.append(f"merge core {core}: {len(loads)} loads / {len(folds)} folds, "
                        f"{len(finals)} results / {len(stores)} stores")
            continue
        for j in range(len(loads)):
            _need(errs, hb, loads[j], folds[j], f"merge core {core} partial {j}: folded "
                  f"before its load")
            if j >= 2:
                _need(errs, hb, folds[j - 2], loads[j], f"merge core {core} partial {j}: "
                      f"load into a slot still being folded")
        for k in range(len(finals)):
            _need(errs, hb, finals[k], stores[k], f"merge core {core} result {k}: stored "
                  f"before BDC wrote it")
            if k:
                _need(errs, hb, stores[k - 1], finals[k], f"merge core {core} result {k}: "
                      f"written into the out slot while it is being stored")
    return errs


def check_across_phases(trace: np.ndarray, hb: HappensBefore) -> list[str]:
    """What one phase writes to L2, every core of the next phases reads after: each core's
    last L2 write of a segment happens before every core's first L2 read of a later one."""
    errs = []
    seg = _segments(trace)
    dma = trace["op"] == Op.DMA
    writes = dma & (trace["dst"] == Mem.L2) & (trace["engine"] == Engine.GDMA)
    reads = dma & (trace["src"] == Mem.L2) & (trace["engine"] == Engine.GDMA)
    cores = np.unique(trace["core"]).tolist()
    for k in np.unique(seg[writes]).tolist():
        last_w = [int(trace["id"][writes & (seg == k) & (trace["core"] == c)].max())
                  for c in cores if (writes & (seg == k) & (trace["core"] == c)).any()]
        for c in cores:
            later = reads & (seg > k) & (trace["core"] == c)
            if later.any():
                r = int(trace["id"][later].min())
                for w in last_w:
                    _need(errs, hb, w, r, f"segment {k}: core {int(trace['core'][w])}'s L2 "
                          f"writes may land after core {c} reads L2 in a later segment")
    return errs


def check(trace: np.ndarray, buffers: int, d: int) -> list[str]:
    errs = check_basic(trace)
    if not errs:
        hb = HappensBefore(trace)
        errs += check_buffers(trace, buffers, d, hb)
        for ph in (1, 4):
            errs += check_projection(trace, ph, hb)
        errs += check_merge(trace, hb)
        errs += check_across_phases(trace, hb)
    return errs
