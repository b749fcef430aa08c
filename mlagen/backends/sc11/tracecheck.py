"""Invariants of an SC11 trace, checked from the trace alone (tests and the verifier).

Happens-before is what the card guarantees: an event starts after its deps and after the
previous event of its own (core, engine) queue.  From that:

* ids are 0..n-1 and deps point at earlier events (so id order is a valid schedule);
* every barrier number has one event per core;
* phase B multi-buffer (reconstructed per core in issue order): the BDC work of step k
  happens after the GDMA that moved step k's tile into LMEM, which happens after the SDMA
  gather of step k into L2; and the SDMA / GDMA of step k happen after the BDC work of
  step k - buffers that last used the same slots (no DMA into a slot in use).
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
        for i in range(len(trace)):
            q = self.queue[i]
            row = anc[last[q]].copy() if last[q] >= 0 else np.full(self.nq, -1, np.int64)
            for d in trace["deps"][i]:
                if d >= 0:
                    np.maximum(row, anc[d], out=row)
            row[q] = i
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
        is_qk = e["op"] == Op.MATMUL and e["k"] * 2 == d_bytes
        if is_qk and any(int(x) in gset for x in e["deps"]):
            if cur_last is not None:
                last.append(cur_last)
            first.append(int(e["id"]))
            cur_last = int(e["id"])
        elif first and e["op"] in (Op.MATMUL, Op.VECTOR) and cur_last is not None:
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


def check(trace: np.ndarray, buffers: int, d: int) -> list[str]:
    errs = check_basic(trace)
    if not errs:
        errs += check_buffers(trace, buffers, d)
    return errs
