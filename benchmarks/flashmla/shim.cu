// A C entry point into FlashMLA's dense sm90 decode (its April-2025 release), so that
// it can be timed beside mlagen in one device visit without a torch extension build.
// Our glue only: it fills FlashMLA's own params struct and calls its launchers.
#include <cuda_runtime.h>
#include <cmath>
#include <cutlass/numeric_types.h>
#include "kernels/params.h"
#include "kernels/get_mla_metadata.h"
#include "kernels/mla_combine.h"
#include "kernels/splitkv_mla.h"
#include "kernels/config.h"

extern "C" int fm_metadata(int *seqlens_k, int *meta, int *num_splits, int batch,
                           int num_sm_parts, void *stream) {
    Mla_metadata_params p = {};
    p.seqlens_k_ptr = seqlens_k;
    p.tile_scheduler_metadata_ptr = meta;
    p.num_splits_ptr = num_splits;
    p.batch_size = batch;
    p.block_size_n = Config::PAGE_BLOCK_SIZE;
    p.fixed_overhead_num_blocks = Config::FIXED_OVERHEAD_NUM_BLOCKS;
    p.num_sm_parts = num_sm_parts;
    run_get_mla_metadata_kernel(p, (cudaStream_t)stream);
    return (int)cudaGetLastError();
}

// q: [b, q_seq_per_hk, h_k, 576], k: [num_blocks, page, h_k, 576], out: [b, q_seq_per_hk,
// h_k, 512], all contiguous; lse: [b, h_k, q_seq_per_hk] fp32; the accumulators sized
// as FlashMLA's API sizes them (b + num_sm_parts splits).
extern "C" int fm_fwd(void *q, void *k, void *out, void *lse, void *lse_accum, void *o_accum,
                      int *block_table, long long bt_stride, int *seqlens_k, int *meta,
                      int *num_splits, int num_sm_parts, int batch, int s_q, int h_q, int h_k,
                      int num_blocks, int page_block_size, int is_causal, float scale,
                      void *stream) {
    Flash_fwd_mla_params p = {};
    const int per_hk = h_q / h_k;
    p.b = batch;
    p.s_q = s_q;
    p.q_seq_per_hk = s_q * per_hk;
    p.d = 576;
    p.d_v = 512;
    p.h_q = h_q;
    p.h_k = h_k;
    p.num_blocks = num_blocks;
    p.q_head_per_hk = per_hk;
    p.is_causal = s_q == 1 ? false : bool(is_causal);
    p.scale_softmax = scale;
    p.scale_softmax_log2 = float(scale * M_LOG2E);
    p.q_ptr = q;
    p.k_ptr = k;
    p.o_ptr = out;
    p.softmax_lse_ptr = lse;
    p.q_row_stride = (long long)h_k * 576;
    p.q_head_stride = 576;
    p.q_batch_stride = (long long)p.q_seq_per_hk * p.q_row_stride;
    p.k_head_stride = 576;
    p.k_row_stride = (long long)h_k * 576;
    p.k_batch_stride = (long long)page_block_size * p.k_row_stride;
    p.o_head_stride = 512;
    p.o_row_stride = (long long)h_k * 512;
    p.o_batch_stride = (long long)p.q_seq_per_hk * p.o_row_stride;
    p.block_table = block_table;
    p.block_table_batch_stride = bt_stride;
    p.page_block_size = page_block_size;
    p.seqlens_k_ptr = seqlens_k;
    p.tile_scheduler_metadata_ptr = meta;
    p.num_sm_parts = num_sm_parts;
    p.num_splits_ptr = num_splits;
    p.total_num_splits = batch + num_sm_parts;
    p.softmax_lseaccum_ptr = lse_accum;
    p.oaccum_ptr = o_accum;
    run_flash_splitkv_mla_kernel<cutlass::bfloat16_t>(p, (cudaStream_t)stream);
    run_flash_mla_combine_kernel<cutlass::bfloat16_t>(p, (cudaStream_t)stream);
    return (int)cudaGetLastError();
}
