"""The SC11 resource model: LMEM per core and L2 per chip, as the kernel lays them out."""

from __future__ import annotations

from ... import formats   # KV formats as data (no torch: check and generate stay light)
from ...schedule.records import Schedule
from ...schedule.resources import Need
from ...targets import Target

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
    fmt = formats.get(p.kv)
    kvb = fmt.token_bytes(p.kv_lora_rank, p.rope_dim)   # a cached token's bytes
    d, dv = p.d, p.dv
    bank, align = sc11_granules(t)
    r = lambda x: _round(x, bank)   # noqa: E731
    sparse = p.attention == "sparse"
    # query rows a core may hold in phase B (sparse: each query row is its own sequence)
    rows = s.heads_per_device * (1 if sparse else p.max_s_q)
    nb, tile, pr = m.buffers, m.seq_tile, SC11_PROJ_ROWS
    part = rows * (dv + 1) * 4
    phases = {
        "B": {"q": nb * r(rows * d * el),               # q rows, one slot per KV stage
              "kv": nb * r(tile * kvb),                 # KV tiles: every multi-buffer slot
              "out": r(part),                           # output staging (one slot)
              "work": r(rows * (m.block_kv + dv + 2) * 4)},   # scores, O acc, max, sum
        "merge": {"partials": 2 * r(part), "out": r(part), "work": r(rows * (dv + 2) * 4)},
    }
    if fmt.quantized:     # the BDC's dequantized 16-bit block the cube reads
        phases["B"]["deq"] = r(m.block_kv * d * el)
    if fmt.needs_descale:  # the descales, one bank while batch * 4 B fit in one
        phases["B"]["descale"] = r(4)
    if sparse:            # the index ring the gathers' descriptors are written from
        phases["B"]["index"] = r(nb * tile * 4)
    if p.sinks:           # the heads' sinks (phase B and the merge apply them)
        phases["B"]["sinks"] = r(s.heads_per_device * 4)
        phases["merge"]["sinks"] = r(s.heads_per_device * 4)
    if p.fused:
        nope, rope, vh, ql = p.qk_nope_head_dim, p.rope_dim, p.v_head_dim, p.q_lora_rank
        phases["A"] = {"weights": 2 * r((ql * (nope + rope) + nope * dv) * el),
                       "in": 2 * r(pr * ql * el), "out": 2 * r(pr * d * el),
                       "work": r(pr * (nope + rope + dv) * 4)}
        phases["C"] = {"weights": 2 * r(dv * vh * el), "in": 2 * r(pr * dv * el),
                       "out": 2 * r(pr * vh * el), "work": r(pr * vh * 4)}
    totals = {ph: sum(b.values()) for ph, b in phases.items()}
    worst = max(totals, key=totals.get)
    l2 = m.cores * nb * _round(tile * kvb, align)
    out = {"lmem": totals[worst], "l2": l2, "lmem_phase": worst}
    out.update({f"lmem.{ph}.{k}": v for ph, bufs in phases.items() for k, v in bufs.items()})
    return out


def needs(s: Schedule, t: Target) -> list[Need]:
    lay = sc11_layout(s, t)
    p = s.problem
    fmt = formats.get(p.kv)
    token = (f"{p.d} x 2 B" if not fmt.quantized
             else f"{fmt.token_bytes(p.kv_lora_rank, p.rope_dim)} B ({p.kv})")
    worst = lay["lmem_phase"]
    detail = f"phase {worst}: " + ", ".join(
        f"{k.split('.')[2]} {v}" for k, v in lay.items() if k.startswith(f"lmem.{worst}."))
    return [
        Need("LMEM bytes per core", lay["lmem"], int(t.lmem_bytes), "seq_tile", detail),
        Need("L2 bytes per chip", lay["l2"], int(t.l2_bytes), "buffers",
             f"cores {s.mapping.cores} x buffers {s.mapping.buffers} x seq_tile "
             f"{s.mapping.seq_tile} x {token}"),
    ]
