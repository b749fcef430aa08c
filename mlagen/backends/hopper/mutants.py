"""The Hopper mutants (mlagen.verify.mutants): one-line slips in the 64-row wgmma kernel
(mla_wgmma.cuh), the few-rows kernel (mla_wgmma_rows.cuh), the combine (mla_combine.cuh),
the split scheduler and the sparse row lengths (mla_scheduler.cuh,
mla_scheduler_kernel.cuh), the mma.sync kernel (mla_split.cuh) and the
FP8 dequantize path (mla_fp8.cuh and the few-rows kernel's converter).  Distinct from the
kernels' kFault codes (kFaultScaleWrongTile reads tile q + 1, kFaultScaleTwice scales every
value twice, kFaultDescaleNotInOutput drops the descale from O).  Each
names the example schedules whose build runs the line it edits."""

from __future__ import annotations

from ...verify.mutation import Mutant

W64 = ("hopper_wgmma",)
ROWS1 = ("hopper_wgmma_r16", "hopper_wgmma_r32_fp16")          # one consumer warpgroup
ROWS2 = ("hopper_wgmma_r16_w8", "hopper_wgmma_r32_w8")          # two, merged per piece
MMA = ("hopper_h200", "hopper_tp8_r16")
SPLITS = ("hopper_h200", "hopper_wgmma")                        # partials through the combine
SPARSE = ("hopper_sparse_bf16", "hopper_sparse_ds_mla")         # attention = "sparse"
SPARSE_SINKS = ("hopper_sparse_ds_mla",)                         # sinks = true: drawn sinks
SPARSE64 = ("hopper_sparse_bf16_r64", "hopper_sparse_ds_mla_r64")  # sparse, 64-row tiles
DS64 = ("hopper_sparse_ds_mla_r64",)                # the 64-row producer's fp8_ds_mla convert
E4M3_64 = ("hopper_fp8_e4m3_r64",)                  # dense fp8_e4m3 in the 64-row kernel
DENSE64 = ("hopper_fp8_ds_mla_r64",) + E4M3_64       # dense 8-bit rows, the block table's keys
POOLS = ("hopper_sparse_two_pools",)                 # a second pool (extra_topk), its own page
FP8E = ("hopper_fp8_e4m3",)                                      # e4m3 values, k_descale
FP8D = ("hopper_fp8_ds_mla",)                                    # e4m3 tiles with fp32 scales
FP8R = ("hopper_fp8_e4m3_regs",)        # fp8_e4m3 converted in the consumer's registers
FP8M = ("hopper_fp8_e4m3_mma",)         # fp8_e4m3 with e4m3 MMAs (fp8_mma = "mma")
V4 = ("hopper_sparse_v4",)              # d_qk 512, fp8_ue8m0_paged pages, two pools
V4W = ("hopper_sparse_v4_r64",)         # the same in the 64-row kernel

MAX_MOVES = "running-sum rescale when the max moves"
WG_MERGE = "few-rows kernel's warpgroup merge when the second holds the larger max"
PAGE_OFFSET = "page offsets inside pages larger than 64"
BAD_LAST = "the bad-page check on the last page of a piece"
FP8_SCALE = "the FP8 dequantize path's scales"

MUTANTS = (
    # ---- the 64-row wgmma kernel
    Mutant("wgmma_sum_not_rescaled", "hopper", "mla_wgmma.cuh",
           "lsum[0] = lsum[0] * alpha[0] + sum[0];", "lsum[0] = lsum[0] + sum[0];",
           "the running sum of a thread's first row is not rescaled when its max moves",
           W64, MAX_MOVES),
    Mutant("wgmma_page_offset", "hopper", "mla_wgmma.cuh",
           "const int off = t0 % p.page_size;", "const int off = t0 % C::kBlock;",
           "a block's offset inside its page taken modulo the block (pages = blocks)",
           W64, PAGE_OFFSET),
    Mutant("wgmma_bad_page_last", "hopper", "mla_wgmma.cuh",
           "for (int pi = first + t; pi <= last; pi += threads) {",
           "for (int pi = first + t; pi < last; pi += threads) {",
           "the bad-page check stops before the piece's last page (< for <=)",
           W64, BAD_LAST),
    Mutant("wgmma_unmasked_block", "hopper", "mla_wgmma.cuh",
           "if (t0 + C::kBlock <= min(lim[0], lim[1]) && vmask == kAllKeys) {",
           "if (t0 + C::kBlock <= max(lim[0], lim[1]) && vmask == kAllKeys) {",
           "a block is taken unmasked when one of a thread's two rows may see all of it",
           W64),
    # ---- the few-rows kernel (16 / 32 rows; warps 8: two warpgroups merged per piece)
    Mutant("rows_sum_not_rescaled", "hopper", "mla_wgmma_rows.cuh",
           "lsum[c] *= alpha[c];   // this thread's share of the column sum",
           "// this thread's share of the column sum (not rescaled)",
           "the running column sum is not rescaled when the max moves", ROWS1, MAX_MOVES),
    Mutant("rows_merge_first_max", "hopper", "mla_wgmma_rows.cuh",
           "const float mm = fmaxf(m0, m1);",
           "const float mm = m0 == -INFINITY ? m1 : m0;",
           "the merge keeps the first warpgroup's max (overflows when the second's is far "
           "larger)", ROWS2, WG_MERGE),
    Mutant("rows_merge_l_weight", "hopper", "mla_wgmma_rows.cuh",
           "l[c] = sm.stat[N + col] * f0 + sm.stat[3 * N + col] * f1;",
           "l[c] = sm.stat[N + col] * f0 + sm.stat[3 * N + col] * f0;",
           "the merged sum weighs the second warpgroup's l with the first's factor",
           ROWS2, WG_MERGE),
    Mutant("rows_page_offset", "hopper", "mla_wgmma_rows.cuh",
           "j * 64, t0 % p.page_size, page);", "j * 64, t0 % C::kBlock, page);",
           "a block's row inside its page taken modulo the block", ROWS1, PAGE_OFFSET),
    Mutant("rows_bad_page_bound", "hopper", "mla_wgmma_rows.cuh",
           "return page < 0 || page >= p.num_blocks;",
           "return page < 0 || page > p.num_blocks;",
           "an entry equal to num_blocks passes the bad-page check (> for >=)",
           ROWS1 + FP8R, BAD_LAST),
    # ---- the few-rows kernel's token-sparse mode (indices name the keys)
    Mutant("rows_sparse_unmasked", "hopper", "mla_wgmma_rows.cuh",
           "const float x = key < lc && vk ? s[i2] * scale : -INFINITY;",
           "const float x = key < lc ? s[i2] * scale : -INFINITY;",
           "a key whose slot names none (-1) is not masked: its zero-filled row scores 0",
           SPARSE),
    Mutant("rows_sparse_key_row", "hopper", "mla_sparse.cuh",
           "const int64_t o = __shfl_sync(0xffffffffu, off, k);",
           "const int64_t o = __shfl_sync(0xffffffffu, off, k ^ 1);",
           "the gather writes each key into its neighbour's row (the mask stays the key's)",
           ("hopper_sparse_ds_mla",)),
    Mutant("rows_sink_on_partials", "hopper", "mla_wgmma_rows.cuh",
           "const float keep = pc.direct && p.sink != nullptr && gr < rows_total",
           "const float keep = p.sink != nullptr && gr < rows_total",
           "a split row's partial is scaled by the sink too (then the combine scales it again)",
           SPARSE_SINKS),
    # ---- the slice gather (mla_sparse.cuh: the rows kernel's bf16 mode and the 64-row
    # kernel's sparse modes)
    Mutant("sparse_slice_key_row", "hopper", "mla_sparse.cuh",
           "for (int i = 0; i < 4; ++i) o[i] = __shfl_sync(0xffffffffu, off, 4 * i + (lane >> 3));",
           "for (int i = 0; i < 4; ++i) o[i] = __shfl_sync(0xffffffffu, off, (4 * i + (lane >> 3)) ^ 1);",
           "the slice gather writes each key into its neighbour's row (the mask stays the "
           "key's)", ("hopper_sparse_bf16",) + SPARSE64),
    # ---- the second pool of keys (mla_sparse.cuh SparseRow: both kernels' sparse modes)
    Mutant("sparse_extra_page_size", "hopper", "mla_sparse.cuh",
           "const int ps = x ? p.page_size2 : p.page_size;",
           "const int ps = p.page_size;",
           "an extra pool's slot split into page and offset by the main pool's page size",
           POOLS, PAGE_OFFSET),
    Mutant("sparse_pool_split_late", "hopper", "mla_sparse.cuh",
           "r.split = p.len1[req];", "r.split = p.len1[req] + 1;",
           "the row's keys switch to the extra pool one late: the main list's entry past "
           "topk_length counts and the extra list's last key is dropped", POOLS),
    # ---- a sparse call's row lengths (mla_scheduler_kernel.cuh, one launch)
    Mutant("sparse_length_unclipped", "hopper", "mla_scheduler_kernel.cuh",
           "const int main = topk_length ? min(topk_length[b], topk) : topk;",
           "const int main = topk_length ? topk_length[b] : topk;",
           "topk_length past topk not clipped: the row reads entries past its list (the next "
           "row's)", SPARSE, "topk_length past topk"),
    Mutant("sparse_extra_length_unclipped", "hopper", "mla_scheduler_kernel.cuh",
           "min(extra_topk_length[b], extra_topk)", "extra_topk_length[b]",
           "extra_topk_length past extra_topk not clipped", POOLS, "topk_length past topk"),

    Mutant("wgmma_sparse_unmasked", "hopper", "mla_wgmma.cuh",
           "xs[4 * j + e] = t0 + k < lim[e >> 1] && named ? s[4 * j + e] : -INFINITY;",
           "xs[4 * j + e] = t0 + k < lim[e >> 1] ? s[4 * j + e] : -INFINITY;",
           "a key whose slot names none (-1) is not masked: its zero-filled row scores 0",
           SPARSE64),
    Mutant("wgmma_sink_on_partials", "hopper", "mla_wgmma.cuh",
           "if (pc.direct && p.sink != nullptr && gr < rows_total && l > 0.f)",
           "if (p.sink != nullptr && gr < rows_total && l > 0.f)",
           "a split row's partial is scaled by the sink too (then the combine scales it again)",
           SPARSE64),
    # ---- index entries read a block ahead of their use (the 64-row kernel's sparse modes)
    Mutant("wgmma_mask_entries_ahead", "hopper", "mla_wgmma.cuh",
           "ea = sparse_entry(row, t0 + C::kBlock + lane, pc.end);",
           "ea = sparse_entry(row, t0 + 2 * C::kBlock + lane, pc.end);",
           "the consumer's key mask: the entries of the block's first 32 keys read two blocks "
           "ahead instead of one (each later block masked by the next one's slots)", SPARSE64),
    Mutant("ds64_latent_entries_ahead", "hopper", "mla_wgmma.cuh",
           "const int64_t x = key_offset(p, row, t0 + pl, el);",
           "const int64_t x = key_offset(p, row, t0 + pl, nl);",
           "8-bit crossover (ds_load): a block's latent loaded from the next block's entries "
           "(the entries read ahead used a block early)", DS64 + E4M3_64),
    Mutant("paged64_latent_entries_ahead", "hopper", "mla_wgmma.cuh",
           "p, row, t0 + pl, el, 1, &xs);", "p, row, t0 + pl, nl, 1, &xs);",
           "fp8_ue8m0_paged crossover: a block's data and scale rows loaded from the next "
           "block's entries", V4W),
    Mutant("wgmma_ds_scale_first_tile", "hopper", "mla_wgmma.cuh",
           "const float scale = f[FAULT == kFaultScaleWrongTile ? (q + 1) & 3 : q];",
           "const float scale = f[FAULT == kFaultScaleWrongTile ? (q + 1) & 3 : q & 2];",
           "fp8_ds_mla (64-row producer): latent tiles 1 and 3 take the scale of tiles 0 "
           "and 2", DS64 + DENSE64[:1], FP8_SCALE),
    Mutant("wgmma_ds_cross_peer_row", "hopper", "mla_wgmma.cuh",
           "peer_copy(tile, rtile, 2 * q * C::kSliceBytes + rows, rfull + 2 * q * 8, lane);",
           "peer_copy(tile, rtile, (2 * q + 1) * C::kSliceBytes + rows, rfull + 2 * q * 8, lane);",
           "fp8_ds_mla crossover (h_q 128): the copy of a CTA's converted rows into the other "
           "CTA's even slice reads the odd one (the even slice keeps a stale block's rows)",
           DS64 + DENSE64),
    Mutant("wgmma_paged_cross_peer_row", "hopper", "mla_wgmma.cuh",
           "(2 * q + h) * C::kSliceBytes + rows, rfull + (2 * q + h) * 8, lane);",
           "(2 * q + 1) * C::kSliceBytes + rows, rfull + (2 * q + h) * 8, lane);",
           "fp8_ue8m0_paged crossover (h_q 128): the copies of a CTA's converted rows into "
           "the other CTA's slices all read the odd slice (its even slices keep a stale "
           "block's rows)", V4W),
    Mutant("wgmma_ds_rope_offset", "hopper", "mla_wgmma.cuh",
           "kc + (ok ? o[i] : 0) + L::kTokenBytes - 128 + c * 16, ok);",
           "kc + (ok ? o[i] : 0) + L::kTokenBytes - 144 + c * 16, ok);",
           "fp8_ds_mla (64-row producer): the RoPE read 16 bytes early (the scales as its "
           "first 8 values)", DS64 + DENSE64[:1]),
    Mutant("wgmma_gather_entries_ahead", "hopper", "mla_wgmma.cuh",
           "sparse_lane_keys(key_offset(p, row, t0 + pr, er), lane, o);",
           "sparse_lane_keys(key_offset(p, row, t0 + pr, nr), lane, o);",
           "the 64-row converting producer: a block's keys gathered by the next block's "
           "entries (index or block-table entries read ahead used a block early)",
           DS64 + DENSE64),
    Mutant("wgmma_gather_page_offset", "hopper", "mla_wgmma.cuh",
           "static_cast<unsigned>(pos) % p.page_size) * p.k_stride_token;",
           "static_cast<unsigned>(pos) % C::kBlock) * p.k_stride_token;",
           "dense 8-bit rows (64-row kernel): a key's place in its page taken modulo the "
           "block (pages = blocks)", DENSE64, PAGE_OFFSET),
    Mutant("wgmma_e4m3_rope_unswizzled", "hopper", "mla_wgmma.cuh",
           "fp8::st_shared_v4(tile + 8 * C::kSliceBytes + r * 128 + ((c ^ (r & 7)) << 4), w[0], w[1],",
           "fp8::st_shared_v4(tile + 8 * C::kSliceBytes + r * 128 + (c << 4), w[0], w[1],",
           "fp8_e4m3 (64-row kernel): the widened RoPE chunks stored unswizzled", E4M3_64),
    Mutant("wgmma_e4m3_rope_offset", "hopper", "mla_wgmma.cuh",
           "kc + (ok ? o[i] : 0) + 512 + c * 16, ok);",
           "kc + (ok ? o[i] : 0) + 496 + c * 16, ok);",
           "fp8_e4m3 (64-row kernel): the RoPE bytes read 16 bytes early (the latent's last "
           "16 as its first 16 values)", E4M3_64),
    Mutant("wgmma_e4m3_cross_rope_offset", "hopper", "mla_wgmma.cuh",
           "g.rope[i] = ok ? __ldg(reinterpret_cast<const uint2*>(src + 512 + 8 * c))",
           "g.rope[i] = ok ? __ldg(reinterpret_cast<const uint2*>(src + 504 + 8 * c))",
           "fp8_e4m3 crossover (row tiles in pairs): the RoPE bytes loaded 8 bytes early",
           E4M3_64),
    Mutant("wgmma_e4m3_cross_rope_peer_row", "hopper", "mla_wgmma.cuh",
           "peer_copy(tile, rtile, 8 * C::kSliceBytes + rows, rfull + 8 * 8, lane);",
           "peer_copy(tile, rtile, 7 * C::kSliceBytes + rows, rfull + 8 * 8, lane);",
           "fp8_e4m3 crossover: the RoPE rows a CTA widens reach the other CTA from the slice "
           "before (its slice 8 keeps a stale block's rows)", E4M3_64),
    Mutant("wgmma_f16_q_scale_row", "hopper", "mla_wgmma.cuh",
           "127 - __shfl_sync(0xffffffffu, e, 2 * (lane >> 2) + 16 * h)) << 23);",
           "127 - __shfl_sync(0xffffffffu, e, 2 * (lane >> 2))) << 23);",
           "fp8_e4m3 with bf16 q (64-row kernel, fp16 MMAs): a thread's second row (r0 + 8) "
           "unscaled by its first row's power of two (the q_spread path case spreads them)",
           E4M3_64),
    Mutant("wgmma_f16_q_scale_not_undone", "hopper", "mla_wgmma.cuh",
           "sc2[h] = scale * __uint_as_float(static_cast<uint32_t>(",
           "sc2[h] = scale * __uint_as_float(254u - static_cast<uint32_t>(",
           "fp8_e4m3 with bf16 q (64-row kernel): the scores' scale times 2^e instead of 2^-e "
           "(q's row scale applied twice)", E4M3_64),
    Mutant("wgmma_e4m3_descale_not_in_scores", "hopper", "mla_wgmma.cuh",
           "(FAULT == kFaultWrongScale ? p.scale_log2 * 1.01f : p.scale_log2) * (dk * dq);",
           "(FAULT == kFaultWrongScale ? p.scale_log2 * 1.01f : p.scale_log2) * dq;",
           "fp8_e4m3 (64-row kernel): the k descale left out of the scores' scale (kept in O)",
           E4M3_64, FP8_SCALE),
    # ---- the combine
    Mutant("combine_half_scale", "hopper", "mla_combine.cuh",
           "const float wj = j < kCombineVec / 2 ? w.x : w.y;", "const float wj = w.x;",
           "the second 256-column half of an fp16 partial is read with the first's scale",
           W64),
    Mutant("combine_max_skips_last", "hopper", "mla_combine.cuh",
           "for (int i = lane; i < n; i += 32) {", "for (int i = lane; i < n - 1; i += 32) {",
           "the max over the splits' lse leaves the last split out", SPLITS, MAX_MOVES),
    Mutant("combine_sink_dropped", "hopper", "mla_combine.cuh",
           "const float keep = p.sink != nullptr ? sink_keep(lse, p.sink[gr % p.h_q]) : 1.f;",
           "const float keep = 1.f;",
           "a combined (split) row is not scaled by its head's sink", SPARSE_SINKS),
    Mutant("combine_empty_lse", "hopper", "mla_combine.cuh",
           "nan ? NAN : (sum > 0.f ? mx + logf(sum) : INFINITY);",
           "nan ? NAN : mx + logf(sum);",
           "a combined row that saw no key gets lse -inf (the convention is +inf)", SPLITS),
    # ---- the split scheduler (run on the GPU by the metadata kernel)
    Mutant("sched_piece_start", "hopper", "mla_scheduler.cuh",
           "md[1] = f0 == p ? 0 : static_cast<int>(p * payload - cum[r0] - fixed_cost) * 64;",
           "md[1] = f0 == p ? 0 : static_cast<int>(p * payload - cum[r0] - fixed_cost + 1) * 64;",
           "a part that starts inside a request starts one block late", SPLITS),
    Mutant("sched_payload_floor", "hopper", "mla_scheduler.cuh",
           "const long long p = (total + parts - 1) / parts;",
           "const long long p = total / parts;",
           "the cost a part takes rounded down (the last blocks fall past the last part)",
           SPLITS),
    # ---- the mma.sync kernel
    Mutant("split_sum_not_rescaled", "hopper", "mla_split.cuh",
           "l = l * alpha + sum;", "l = l + sum;",
           "the running sum is not rescaled when the max moves", MMA, MAX_MOVES),
    Mutant("split_page_offset", "hopper", "mla_split.cuh",
           "src = k + pg.page * p.k_stride_block + (t % p.page_size) * p.k_stride_token;",
           "src = k + pg.page * p.k_stride_block + (t % BKV) * p.k_stride_token;",
           "a key's slot inside its page taken modulo the key block", MMA, PAGE_OFFSET),
    Mutant("split_alpha_unguarded", "hopper", "mla_split.cuh",
           "const float alpha = m_new == -INFINITY ? 1.f : exp2f(m - m_new);",
           "const float alpha = exp2f(m - m_new);",
           "the rescale of a row that has seen no key yet is exp2(-inf + inf) = NaN", MMA),
    # ---- the FP8 dequantize path (the few-rows kernel's converter warpgroup, mla_fp8.cuh)
    Mutant("fp8_scale_tile_pairs", "hopper", "mla_wgmma_rows.cuh",
           "sm90::ld_shared_f32(tail + r * L::kTailRow + 4 * tile));",
           "sm90::ld_shared_f32(tail + r * L::kTailRow + 4 * (tile & 2)));",
           "fp8_ds_mla: latent tiles 1 and 3 read the scale of tiles 0 and 2 (the wrong "
           "128-column tile)", FP8D, FP8_SCALE),
    Mutant("fp8_descale_twice_in_output", "hopper", "mla_wgmma_rows.cuh",
           "const float o_scale = FAULT == kFaultDescaleNotInOutput ? 1.f : dk;",
           "const float o_scale = FAULT == kFaultDescaleNotInOutput ? 1.f : dk * dk;",
           "fp8_e4m3: the k descale applied twice to O (once in the scores, as it should)",
           FP8E, FP8_SCALE),
    Mutant("fp8_descale_not_in_scores", "hopper", "mla_wgmma_rows.cuh",
           "(FAULT == kFaultWrongScale ? p.scale_log2 * 1.01f : p.scale_log2) * (dk * dq);",
           "(FAULT == kFaultWrongScale ? p.scale_log2 * 1.01f : p.scale_log2) * dq;",
           "fp8_e4m3: the k descale left out of the scores' scale (kept in O)", FP8E,
           FP8_SCALE),
    Mutant("fp8_nan_high_half_dropped", "hopper", "mla_fp8.cuh",
           "hi |= prmt0(nan, 0xbbaau) & 0x7fc07fc0u;", "",
           "e4m3 NaN bytes in the upper half of each 4-byte word read as +-480 (the "
           "converter's NaN path kept for the lower half only)", FP8E + FP8D),
    Mutant("fp8_descale_first_seq", "hopper", "mla_wgmma_rows.cuh",
           "dk = p.k_descale[pc.req * p.k_descale_stride];", "dk = p.k_descale[0];",
           "fp8_e4m3: every sequence takes the first's descale (a per-sequence descale "
           "ignored)", FP8E, FP8_SCALE),
    # ---- conversion in the consumer's registers (mla_fp8_regs.cuh, fp8_converters = 0)
    Mutant("regs_q_not_permuted", "hopper", "mla_wgmma_rows.cuh",
           "const int kp = k0 + 2 * (2 * h + i / 2 + 4 * (i % 2));",
           "const int kp = k0 + 2 * (4 * h + i);",
           "Q stored in cache column order while the K fragments hold each 16 columns "
           "permuted (column pairs 2m + 1 meet the wrong q)", FP8R),
    Mutant("regs_pv_tail_kept", "hopper", "mla_wgmma_rows.cuh",
           "if (rem < C::kBlock) {", "if (false) {",
           "the keys past a piece's end in its last block not zeroed in the V^T fragments "
           "(a NaN there reaches O through P = 0)", FP8R),
    Mutant("regs_value_column", "hopper", "mla_wgmma_rows.cuh",
           "const int vc = C::kRegs ? 16 * warp + 2 * (lane / 4) + ((i2 >> 1) & 1)",
           "const int vc = C::kRegs ? 16 * warp + (lane / 4) + 8 * ((i2 >> 1) & 1)",
           "O^T's rows written as the converter kernel's (row g = value column g), not as "
           "the V^T fragments hold them (row g = column 2g)", FP8R),
    Mutant("regs_pv_pairs_as_stored", "hopper", "mla_wgmma_rows.cuh",
           "using P02 = fp8::Pair<0, 2>;", "using P02 = fp8::Pair<0, 1>;",
           "V^T's fragment pairs taken as the bytes lie (one key, two value columns) "
           "instead of one column of two keys", FP8R),
    # ---- e4m3 MMAs on the register path (fp8_mma = "mma", mla_fp8_regs.cuh)
    Mutant("mma_p_keys_unpermuted", "hopper", "mla_wgmma_rows.cuh",
           "const int kp = fp8::p_kpos(key);   // P^T in the V^T fragments' key order",
           "const int kp = key;   // P^T in plain key order",
           "P^T written in plain key order while the V^T fragments hold each 16 keys "
           "permuted (keys 2c + 1 and 8 + 2c trade places)", FP8M),
    Mutant("mma_q_scale_first_row", "hopper", "mla_wgmma_rows.cuh",
           "qinv[c] = sm.stat[C::kQScale + c2 + (c & 1) + 8 * (c >> 1)];   // its q_scale",
           "qinv[c] = sm.stat[C::kQScale];   // its q_scale",
           "every query row's scores scaled by the first row's q_scale (amax / 448 of the "
           "first head) instead of its own", FP8M),
    Mutant("regs_q_scale_first_row", "hopper", "mla_wgmma_rows.cuh",
           "qinv[c] = sm.stat[C::kQScale + 8 * (c >> 1) + c2 + (c & 1)];",
           "qinv[c] = sm.stat[C::kQScale];",
           "every query column's scores unscaled by the first row's power of two (randn rows "
           "mostly share one; the q_spread path case spreads them 12 binades)", FP8R),
    Mutant("regs_rope_swizzle", "hopper", "mla_wgmma_rows.cuh",
           "sm90::ldsm_x4(rope + ((c ^ ((r >> 1) & 3)) << 4), w);",
           "sm90::ldsm_x4(rope + ((c ^ (r & 3)) << 4), w);",
           "the rope box read with the 128-byte swizzle's row pattern instead of the 64-byte "
           "swizzle TMA wrote", FP8R),
    # ---- d_qk 512's page-major fp8_ue8m0_paged cache (the sparse gather and converter)
    Mutant("paged_scale_row_stride", "hopper", "mla_sparse.cuh",
           "*scale = base + static_cast<int64_t>(ps) * ROW + (e % ps) * 8;",
           "*scale = base + static_cast<int64_t>(ps) * ROW + (e % ps) * 7;",
           "fp8_ue8m0_paged: a key's scale row found 7 bytes a token apart (the 7 scales "
           "without the pad byte) instead of 8", V4, FP8_SCALE),
    Mutant("paged_data_row_as_view", "hopper", "mla_sparse.cuh",
           "return base + static_cast<int64_t>(e % ps) * ROW;",
           "return base + (e % ps) * (x ? p.k2_stride_token : p.k_stride_token) * elem;",
           "fp8_ue8m0_paged: a key's data row at the [blocks, page, 1, 584] view's token "
           "stride (584) instead of the page's 576-byte data rows", V4),
    Mutant("paged_rope_unswizzled", "hopper", "mla_wgmma_rows.cuh",
           "fp8::st_shared_v4(dst + r * 128 + ((c ^ (r & 7)) << 4), a.x, a.y, a.z, a.w);",
           "fp8::st_shared_v4(dst + r * 128 + (c << 4), a.x, a.y, a.z, a.w);",
           "fp8_ue8m0_paged: the RoPE slice's even chunks stored without the 128-byte "
           "swizzle the wgmma descriptors read", V4),
    Mutant("paged_scale_per_pair", "hopper", "mla_wgmma_rows.cuh",
           "const int ts = FAULT == kFaultScaleWrongTile ? (sl + 1) % 7 : sl;",
           "const int ts = FAULT == kFaultScaleWrongTile ? (sl + 1) % 7 : 2 * q;",
           "fp8_ue8m0_paged: one scale for both slices of a pair (fp8_ds_mla's 128-value "
           "tiles) instead of one per 64 values", V4, FP8_SCALE),
    Mutant("paged64_tail_chunk_early", "hopper", "mla_wgmma.cuh",
           "return kc + (sparse_has_key(o) ? o : 0) + 384 + c * 16;",
           "return kc + (sparse_has_key(o) ? o : 0) + 320 + c * 16;",
           "fp8_ue8m0_paged, 64-row kernel: the latent's last 64 bytes (the side buffer's) "
           "read from 64 bytes early", V4W),
    Mutant("paged64_rope_unswizzled", "hopper", "mla_wgmma.cuh",
           "sm90::cp_async16_to(tile + 7 * C::kSliceBytes + r * 128 + ((c ^ (r & 7)) << 4),",
           "sm90::cp_async16_to(tile + 7 * C::kSliceBytes + r * 128 + (c << 4),",
           "fp8_ue8m0_paged, 64-row kernel: the RoPE slice gathered without the 128-byte "
           "swizzle the wgmma descriptors read", V4W),
    Mutant("paged64_scale_per_pair", "hopper", "mla_wgmma.cuh",
           "const int ts = FAULT == kFaultScaleWrongTile ? (sl + 1) % 7 : sl;",
           "const int ts = FAULT == kFaultScaleWrongTile ? (sl + 1) % 7 : 2 * q;",
           "fp8_ue8m0_paged, 64-row kernel: one scale for both slices of a pair instead of "
           "one per 64 values", V4W, FP8_SCALE),
)
