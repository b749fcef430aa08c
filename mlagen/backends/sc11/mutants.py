"""The SC11 kernel's mutants (mlagen.verify.mutants): one-line slips in the emulated
kernel (templates/sc11/runtime/mla.h) and its work plan (plan.h), each caught by `verify`
on the example schedules it names."""

from __future__ import annotations

from ...verify.mutation import Mutant

SC11 = ("sc11_attn", "sc11_fused_tp4")
SC11_FUSED = ("sc11_fused_tp4",)
SPARSE = ("sc11_sparse_ds_mla", "sc11_sparse_two_pools")
SPARSE_TWO_POOLS = ("sc11_sparse_two_pools",)     # the one with an extra pool and sinks
SPARSE_PAGED = ("sc11_sparse_v4_fp8",)           # fp8_ue8m0_paged pools
SPARSE_FUSED = ("sc11_sparse_fused",)            # the fused operator over a sparse pool


MUTANTS = (
    Mutant("sum_not_rescaled", "sc11", "mla.h",
           "L[r] = L[r] * corr + sum;", "L[r] = L[r] + sum;",
           "the running sum is not rescaled when the running max moves", SC11,
           "running-sum rescale when the max moves"),
    Mutant("rescale_sign", "sc11", "mla.h",
           "const float corr = std::exp(M[r] - m);", "const float corr = std::exp(m - M[r]);",
           "the rescale factor's exponent has its sign flipped", SC11),
    Mutant("mask_strict", "sc11", "mla.h",
           "s[j] = (j0 + j <= lim[r]) ? s[j] * scl : kNegInf;",
           "s[j] = (j0 + j < lim[r]) ? s[j] * scl : kNegInf;",
           "the causal mask drops the query's own key (< for <=)", SC11),
    Mutant("row_query_index", "sc11", "mla.h",
           "for (int r = 0; r < rows; ++r) lim[r] = visible_limit(pc.seq, r / nh);",
           "for (int r = 0; r < rows; ++r) lim[r] = visible_limit(pc.seq, r % a_.s_q);",
           "a row's query index taken as r % s_q (rows are query-major: r / heads)", SC11),
    Mutant("merged_empty_lse", "sc11", "mla.h",
           "lse[r] = Lse[r] == kNegInf ? std::numeric_limits<float>::infinity() : Lse[r];",
           "lse[r] = Lse[r];",
           "a merged row that saw no key keeps lse -inf (the convention is +inf)", SC11,
           "split sequence with a query row that sees no key (s_q > seqlen > block_kv)"),
    Mutant("merge_weights_swapped", "sc11", "mla.h",
           "for (int d = 0; d < DV; ++d) o[d] = o[d] * wo + p[d] * wp;",
           "for (int d = 0; d < DV; ++d) o[d] = o[d] * wp + p[d] * wo;",
           "the merge weighs the running and the new partial with each other's weight", SC11),
    Mutant("page_tail_overrun", "sc11", "mla.h",
           "const int64_t len = Cfg::FAULT == FAULT_PAGE_START_ASSUMED ? len0 : "
           "std::min<int64_t>(PAGE - in, st.t1 - t);",
           "const int64_t len = Cfg::FAULT == FAULT_PAGE_START_ASSUMED ? len0 : "
           "std::min<int64_t>(PAGE, st.t1 - t);",
           "a gather that starts mid-page copies a whole page's worth (runs past the page)",
           SC11),
    Mutant("tile_last_exclusive", "sc11", "mla.h",
           "steps.push_back({p, t, t1, t == pc.t0, t + TILE >= pc.t1,",
           "steps.push_back({p, t, t1, t == pc.t0, t + TILE > pc.t1,",
           "a piece that ends exactly on a tile edge is never finalised (> for >=)", SC11),
    Mutant("q_row_stride", "sc11", "mla.h",
           "cq(dst + (int64_t)s * nh * D,", "cq(dst + (int64_t)s * HPC * D,",
           "q rows of query s laid out with the per-core head count, not the piece's", SC11,
           "a head count that leaves the last core short"),
    Mutant("short_core_chunk_last", "sc11", "mla.h",
           "items.push_back({r0, std::min(tokens, r0 + PR), h, h == h0, h == h1 - 1});",
           "items.push_back({r0, std::min(tokens, r0 + PR), h, h == h0, h == h0 + HPC - 1});",
           "a projection chunk's last head is the per-core count's (a short core never ends "
           "its chunk)", SC11_FUSED, "a head count that leaves the last core short"),
    Mutant("slice_end_unclipped", "sc11", "plan.h",
           "for (int64_t t = 0; t < len; t += chunk) out.push_back({t, std::min(len, t + chunk)});",
           "for (int64_t t = 0; t < len; t += chunk) out.push_back({t, t + chunk});",
           "a sequence's last slice is not clipped to its length", SC11),
    # the token-sparse path (attention = "sparse"): the index path, the sinks, the pools
    Mutant("rope_position_late", "sc11", "mla.h",
           "const int64_t pos = a_.seqlens[b] - a_.s_q + s, row = pos < 0 ? -pos : pos;",
           "const int64_t pos = a_.seqlens[b] - a_.s_q + s + 1, row = pos < 0 ? -pos : pos;",
           "phase A turns a query token by the next position's RoPE angle",
           SPARSE_FUSED + SC11_FUSED),
    Mutant("sparse_offset_dropped", "sc11", "mla.h",
           "const int64_t at = ((page * pg + off) % cap + cap) % cap;",
           "const int64_t at = ((page * pg) % cap + cap) % cap;",
           "a slot's offset within its page dropped (every key read from its page's start)",
           SPARSE),
    Mutant("sparse_invalid_not_skipped", "sc11", "mla.h",
           "return slot >= 0;", "return true;",
           "an invalid (-1) index entry is gathered as a key, not skipped", SPARSE,
           "invalid index entries"),
    Mutant("topk_length_plus_one", "sc11", "mla.h",
           "int64_t keep = tl[v / a_.s_q];", "int64_t keep = tl[v / a_.s_q] + 1;",
           "topk_length off by one: one entry past a list's length is kept", SPARSE,
           "topk_length below topk"),
    Mutant("topk_length_unclipped", "sc11", "mla.h",
           "return std::max<int64_t>(0, std::min(n, keep));",
           "return std::max<int64_t>(0, keep);",
           "topk_length past topk not clipped: entries past the list (the next row's) kept",
           SPARSE, "topk_length past topk"),
    Mutant("sink_in_lse", "sc11", "mla.h",
           "const float keys = lse;", "const float keys = joint;",
           "the sink is added into the lse too (the convention leaves lse alone)",
           SPARSE_TWO_POOLS),
    Mutant("sink_sign", "sc11", "mla.h",
           "return 1.f / (1.f + std::exp(sg - lse));", "return 1.f / (1.f + std::exp(lse - sg));",
           "the sink factor's exponent has its sign flipped", SPARSE_TWO_POOLS),
    Mutant("extra_page_for_main", "sc11", "mla.h",
           "const int64_t own = pg;", "const int64_t own = XPAGE;",
           "the main pool's slots split into page and offset by the extra pool's page size",
           SPARSE_TWO_POOLS, "two pools of different page sizes"),
    # gather = "runs": a descriptor a run of adjacent slots of one page
    Mutant("run_crosses_page", "sc11", "mla.h",
           "while (e + len < t1 && len < room && entry(v, e + len, p, next) && p == pool &&",
           "while (e + len < t1 && entry(v, e + len, p, next) && p == pool &&",
           "a run of adjacent slots is not cut at its page's end (paged: the next page's "
           "rows are not after this page's)", SPARSE_PAGED,
           "a window of slots across a page edge"),
    Mutant("run_last_token_dropped", "sc11", "mla.h",
           "cp.rows(d, KVB, base, span, token(pool, slot), KVB, KVB, len);",
           "cp.rows(d, KVB, base, span, token(pool, slot), KVB, KVB, len - 1);",
           "a run's descriptor moves one token too few (its last L2 row keeps stale bytes)",
           SPARSE),
    Mutant("run_joins_repeat", "sc11", "mla.h",
           "next == slot + len)", "(next == slot + len || next == slot + len - 1))",
           "a repeated slot (slot, slot) taken as adjacent: the run reads slot + 1 for it",
           SPARSE, "a repeated entry right after its slot"),
    # fp8_ue8m0_paged: the token's two pieces of its page, and its scales
    Mutant("paged_scale_region_off_by_row", "sc11", "mla.h",
           "if (scales) *scales = pg0 + pg * ROW_B + row * SCALE_B;",
           "if (scales) *scales = pg0 + (pg - 1) * ROW_B + row * SCALE_B;",
           "a page's scale rows looked for one data row early (the last token's data read "
           "as scales)", SPARSE_PAGED),
    Mutant("paged_scale_wrong_group", "sc11", "mla.h",
           "const int e = ue8m0[g];", "const int e = ue8m0[(g + 1) % (LAT / kPagedTile)];",
           "a 64-value group takes the next group's UE8M0 scale", SPARSE_PAGED),
)


