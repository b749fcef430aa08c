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


def sc11_layout(s: Schedule, t: Target) -> dict[str, int]:
    """Bytes of every buffer the SC11 kernel places, per core (LMEM) and per chip (L2).

    The emulator's kernel header allocates exactly these (see templates/sc11/runtime).
    """
    p, m = s.problem, s.mapping
    el = 2  # bf16 / fp16 storage
    d, dv = p.d, p.dv
    hpd = s.heads_per_device
    rows = hpd * p.max_s_q                  # query rows one core may hold in phase B
    tile = m.seq_tile
    lay = {
        "q": rows * d * el,                 # absorbed query of the rows a core works on
        "kv": m.buffers * tile * d * el,    # KV tile buffers (every slot of the multi-buffer)
        "scores": rows * m.block_kv * 4,    # fp32 scores of one block
        "acc": rows * dv * 4,               # fp32 output accumulator
        "stats": rows * 2 * 4,              # running max and sum
    }
    if p.fused:
        hpc = m.heads_per_core or -(-hpd // m.cores)
        # phase A/C weights of the heads one core owns; one head's slice at a time is
        # double-buffered, so count two slices
        w_uq = p.q_lora_rank * (p.qk_nope_head_dim + p.rope_dim) * el
        w_uk = p.qk_nope_head_dim * p.kv_lora_rank * el
        w_uv = p.kv_lora_rank * p.v_head_dim * el
        lay["weights"] = 2 * max(w_uq, w_uk, w_uv)
        lay["proj_rows"] = hpc * p.max_s_q * max(p.q_lora_rank, d) * 4
    lmem = sum(lay.values())
    l2 = m.cores * m.buffers * tile * d * el
    return {"lmem": lmem, "l2": l2, **{f"lmem.{k}": v for k, v in lay.items()}}


def _sc11(s: Schedule, t: Target) -> list[Need]:
    lay = sc11_layout(s, t)
    detail = ", ".join(f"{k[5:]} {v}" for k, v in lay.items() if k.startswith("lmem."))
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
    tiles = (rows // 16) * (bkv // 8)            # 16x8 score tiles of one block
    # 16-row tiles split the reduction over every warp (Q in registers); see kQInRegs
    ksplit = m.warps if rows == 16 else (m.warps // tiles if tiles < m.warps else 1)
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
    # fp32 O accumulator, per thread: rows x 512 / threads
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
