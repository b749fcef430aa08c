"""The Hopper resource model: shared memory per block and accumulator registers."""

from __future__ import annotations

from ... import formats
from ...schedule.records import Schedule
from ...schedule.resources import Need
from ...targets import Target

WGMMA_SMEM = 232448   # mla_wgmma_rows.cuh's kMaxSmem: 227 KiB per CTA


def hopper_smem(s: Schedule) -> dict[str, int]:
    """Shared memory of the split-KV kernel: the same formulas as SplitConfig in
    templates/hopper/include/mla_split.cuh (Q, the K pipeline, P, fp32 scores, row stats),
    or WgmmaConfig in mla_wgmma.cuh for mainloop = "wgmma"."""
    p, m = s.problem, s.mapping
    el = 2
    rows, bkv = m.rows_per_tile, m.block_kv
    if m.mainloop == "wgmma":
        # WgmmaConfig in mla_wgmma.cuh: Q, 2 K stages, P (64 x 64), alpha and l, mbarriers
        # (a full and an empty one per 64-column slice of each stage, and the cluster
        # merge's two),
        # 1 KiB of slack to align the tiles to the 1024-byte swizzle atom; WgmmaRowsConfig
        # in mla_wgmma_rows.cuh (16 or 32 rows): P^T (rows x 64) and a 4-warp x rows
        # exchange of column maxima and sums in place of alpha and l
        q, probs = rows * p.d * el, rows * bkv * el
        if rows == 64:
            bars = 2 * m.buffers * (p.d // 64) + 2
            # Q's tile holds the epilogue's staging too (8 warps x 16 rows of 528 bytes,
            # more than d_qk 512's tile); d_qk 512 keeps a side buffer a stage (a key's last
            # 64 latent bytes and its 8-byte scale row, kSideBytes)
            q = max(q, 8 * 16 * 528)
            side = m.buffers * 64 * (64 + 8) if p.d // 64 == 8 else 0
            kv = m.buffers * bkv * p.d * el
            stats = 2 * rows * 4 + side + bars * 8 + 1024
        else:
            # a ring of 8 KiB slots (one TMA box and two mbarriers each) filling the rest of
            # the 227 KiB: at least `buffers` (2) blocks of 9 slices, 2.8 for 16 rows
            wgs = m.warps // 4
            probs *= wgs
            merge = 0 if wgs == 1 else 2 * 2 * rows * 4 + 16 + rows * 4
            # 8-bit caches: two raw slots of one 64-key block's bytes each (and two mbarriers)
            # before the bf16 ring (Fp8Layout in mla_fp8.cuh)
            fmt = formats.get(p.kv)
            raw = 64 * fmt.token_bytes(p.kv_lora_rank, p.rope_dim) if fmt.quantized else 0
            if fmt.paged:   # a key's data row, then its scale row in 16 bytes (not 8)
                raw += 64 * 8
            raw_slots = m.fp8_raw_slots if raw else 0
            # fp8_converters = 0: the consumers convert in registers, no bf16 ring; the Q
            # rows' scales beside the merge's state
            regs = raw and m.fp8_converters == 0
            merge += rows * 4 if regs else 0
            fixed = q + probs + wgs * 4 * rows * 4 + merge + raw_slots * (raw + 16) + 1024
            slots = 0 if regs else (WGMMA_SMEM - fixed) // (8192 + 16)
            kv = slots * 8192 + raw_slots * raw
            stats = wgs * 4 * rows * 4 + merge + 2 * (slots + raw_slots) * 8 + 1024
        out = {"q": q, "kv": kv, "p": probs, "scores": 0, "stats": stats,
               "total": q + kv + probs + stats}
        if rows < 64:
            out["slots"] = slots         # the bf16 ring's 8 KiB slots (WgmmaRowsConfig::kSlots)
        return out
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


def needs(s: Schedule, t: Target) -> list[Need]:
    sm = hopper_smem(s)
    detail = ", ".join(f"{k} {v}" for k, v in sm.items() if k != "total")
    m = s.mapping
    # fp32 O accumulator, per thread: rows x 512 / threads (the few-rows wgmma kernel: each
    # consumer warpgroup holds the whole O^T of its blocks)
    few = m.mainloop == "wgmma" and m.rows_per_tile < 64
    threads = 128 if few else 32 * m.warps
    acc_regs = m.rows_per_tile * s.problem.dv // threads
    return [
        Need("shared memory bytes per block", sm["total"], int(t.smem_per_block), "buffers",
             detail),
        Need("accumulator registers per thread", acc_regs, int(t.max_regs_per_thread) - 64,
             "rows_per_tile",
             f"{m.rows_per_tile} rows x {s.problem.dv} fp32 over {threads} threads"),
    ] + ([Need("bf16 slots of 8 KiB beside the raw ring (a 64-key block is 9)", 9,
               sm["slots"], "fp8_raw_slots",
               f"{sm['slots']} slots fit beside {m.fp8_raw_slots} raw blocks")]
         if few and formats.get(s.problem.kv).quantized and m.fp8_converters != 0 else [])
