"""can_implement: the resources a schedule needs on its target, against what the target has.

Each target's counter returns the same formulas its kernel uses to lay out memory, so a
schedule that passes here fits when it runs (the SC11 emulator checks capacity again and
raises if this count was wrong).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..targets import Target
from .records import Schedule


@dataclass(frozen=True)
class Need:
    name: str          # e.g. "LMEM bytes per core"
    needed: int
    available: int
    key: str           # the schedule key most responsible, for the error's line
    detail: str = ""   # how `needed` was counted

    @property
    def ok(self) -> bool:
        return self.needed <= self.available


@dataclass(frozen=True)
class ResourceReport:
    needs: list[Need] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(n.ok for n in self.needs)

    @property
    def worst_key(self) -> str:
        bad = [n for n in self.needs if not n.ok]
        return max(bad, key=lambda n: n.needed / max(n.available, 1)).key if bad else ""

    def message(self) -> str:
        bad = [n for n in self.needs if not n.ok]
        return "; ".join(f"needs {n.needed} {n.name} but the target has {n.available}"
                         + (f" ({n.detail})" if n.detail else "") for n in bad)

    def table(self) -> str:
        return "\n".join(f"  {n.name:<32} {n.needed:>12} / {n.available:<12} "
                         f"{'ok' if n.ok else 'TOO MUCH'}  {n.detail}" for n in self.needs)


SC11_PROJ_ROWS = 128   # token rows per chunk of the phase A / C projections (mla.h PROJ_ROWS)


def sc11_granules(t: Target) -> tuple[int, int]:
    """Allocation granules: LMEM by whole banks (per core), L2 by the DMA alignment."""
    return int(t.lmem_bytes) // int(t.lmem_banks), int(t.dma_align)


def sc11_heads_per_core(s: Schedule) -> int:
    """Heads one core owns in phases A and C (and in phase B's "heads" scheme)."""
    return s.mapping.heads_per_core or -(-s.heads_per_device // s.mapping.cores)


def _round(x: int, g: int) -> int:
    return -(-max(x, 1) // g) * g


def sc11_layout(s: Schedule, t: Target) -> dict[str, int | str]:
    """Bytes of every buffer the SC11 kernel places, per core (LMEM) and per chip (L2).

    Mirrors templates/sc11/runtime/mla.h: LMEM is laid out afresh for each phase (A, B,
    merge, C), every allocation rounded up to a whole bank, so a core needs the largest
    phase; L2 holds each core's KV tile slots for the whole run.  Batch-dependent L2
    buffers (the fused operator's q and latent output, split partials) are checked by the
    emulator at run time.  The emulator's LMEM high-water mark equals ``lmem`` when
    s_q = max_s_q.
    """
    p, m = s.problem, s.mapping
    el = 2  # bf16 / fp16 storage
    d, dv = p.d, p.dv
    bank, align = sc11_granules(t)
    r = lambda x: _round(x, bank)   # noqa: E731
    rows = s.heads_per_device * p.max_s_q      # query rows a core may hold in phase B
    nb, tile, pr = m.buffers, m.seq_tile, SC11_PROJ_ROWS
    part = rows * (dv + 1) * 4
    phases = {
        "B": {"q": nb * r(rows * d * el),               # q rows, one slot per KV stage
              "kv": nb * r(tile * d * el),              # KV tiles: every multi-buffer slot
              "out": r(part),                           # output staging (one slot)
              "work": r(rows * (m.block_kv + dv + 2) * 4)},   # scores, O acc, max, sum
        "merge": {"partials": 2 * r(part), "out": r(part), "work": r(rows * (dv + 2) * 4)},
    }
    if p.fused:
        nope, rope, vh, ql = p.qk_nope_head_dim, p.rope_dim, p.v_head_dim, p.q_lora_rank
        phases["A"] = {"weights": 2 * r((ql * (nope + rope) + nope * dv) * el),
                       "in": 2 * r(pr * ql * el), "out": 2 * r(pr * d * el),
                       "work": r(pr * (nope + rope + dv) * 4)}
        phases["C"] = {"weights": 2 * r(dv * vh * el), "in": 2 * r(pr * dv * el),
                       "out": 2 * r(pr * vh * el), "work": r(pr * vh * 4)}
    totals = {ph: sum(b.values()) for ph, b in phases.items()}
    worst = max(totals, key=totals.get)
    l2 = m.cores * nb * _round(tile * d * el, align)
    out = {"lmem": totals[worst], "l2": l2, "lmem_phase": worst}
    out.update({f"lmem.{ph}.{k}": v for ph, bufs in phases.items() for k, v in bufs.items()})
    return out


def _sc11(s: Schedule, t: Target) -> list[Need]:
    lay = sc11_layout(s, t)
    worst = lay["lmem_phase"]
    detail = f"phase {worst}: " + ", ".join(
        f"{k.split('.')[2]} {v}" for k, v in lay.items() if k.startswith(f"lmem.{worst}."))
    return [
        Need("LMEM bytes per core", lay["lmem"], int(t.lmem_bytes), "seq_tile", detail),
        Need("L2 bytes per chip", lay["l2"], int(t.l2_bytes), "buffers",
             f"cores {s.mapping.cores} x buffers {s.mapping.buffers} x seq_tile "
             f"{s.mapping.seq_tile} x {s.problem.d} x 2 B"),
    ]


def hopper_smem(s: Schedule) -> dict[str, int]:
    """Shared memory of the mma_sync split-KV kernel: the same formulas as SplitConfig in
    templates/hopper/include/mla_split.cuh (Q, the K pipeline, P, fp32 scores, row stats)."""
    p, m = s.problem, s.mapping
    el = 2
    rows, bkv = m.rows_per_tile, m.block_kv
    if m.mainloop == "wgmma":
        # WgmmaConfig in mla_wgmma.cuh: Q, 2 K stages, P (64 x 64), alpha and l, mbarriers,
        # 1 KiB of slack to align the tiles to the 1024-byte swizzle atom
        q, kv, probs = rows * p.d * el, m.buffers * bkv * p.d * el, rows * bkv * el
        stats = 2 * rows * 4 + 4 * 8 + 1024
        return {"q": q, "kv": kv, "p": probs, "scores": 0, "stats": stats,
                "total": q + kv + probs + stats}
    tiles = (rows // 16) * (bkv // 8)            # 16x8 score tiles of one block
    # 16-row tiles split the reduction over every warp (Q in registers); larger ones give a
    # warp up to 4 tiles and split the reduction over the rest (kQInRegs, kKSplit)
    group = min(bkv // 8, 4)
    if rows == 16:
        ksplit = m.warps
    elif tiles // group >= m.warps:
        ksplit = 1
    else:
        ksplit = m.warps // (tiles // group)
    q = rows * p.d * el
    kv = m.buffers * bkv * p.d * el
    probs = rows * (bkv + 8) * el
    scores = ksplit * rows * (bkv + 4) * 4
    stats = 2 * rows * 4
    return {"q": q, "kv": kv, "p": probs, "scores": scores, "stats": stats,
            "total": q + kv + probs + scores + stats}


def _hopper(s: Schedule, t: Target) -> list[Need]:
    sm = hopper_smem(s)
    detail = ", ".join(f"{k} {v}" for k, v in sm.items() if k != "total")
    m = s.mapping
    # fp32 O accumulator, per thread: rows x 512 / threads (wgmma: the consumer warpgroups)
    acc_regs = m.rows_per_tile * s.problem.dv // (32 * m.warps)
    return [
        Need("shared memory bytes per block", sm["total"], int(t.smem_per_block), "buffers",
             detail),
        Need("accumulator registers per thread", acc_regs, int(t.max_regs_per_thread) - 64,
             "rows_per_tile",
             f"{m.rows_per_tile} rows x {s.problem.dv} fp32 over {32 * m.warps} threads"),
    ]


COUNTERS = {"sc11": _sc11, "hopper": _hopper}


def can_implement(s: Schedule, t: Target) -> ResourceReport:
    return ResourceReport(COUNTERS[t.kind](s, t))
