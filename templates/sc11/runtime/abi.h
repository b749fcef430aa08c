// The plain C ABI of an SC11 kernel library (no torch headers; Python calls it by ctypes).
#pragma once
#include <cstdint>

#include "trace.h"

extern "C" {

// Pointers are host buffers standing in for the card's DDR; 16-bit values are bf16 or fp16
// bit patterns as the variant's dtype says; the KV cache is in the variant's format
// (mlagen/kvformat.py).  All tensors contiguous.
struct Sc11Args {
  int64_t batch, s_q, num_blocks, max_blocks;
  int64_t scheme;      // 1 heads, 2 batch, 3 seq, 4 batch_seq
  int64_t causal;
  int64_t threads;     // host threads that run the cores (<= 0: hardware threads)
  double scale;
  // fused: the rotary table, row p = position p's cos / sin of each frequency [rope_rows,
  // rope / 2] (fp32, any attention scaling multiplied in; built from the model's rope
  // config by the runner); rope_layout 0: interleaved pairs (x[2i], x[2i+1]), 1: half
  // pairs (x[i], x[i + rope / 2]).  Every position a query takes must be < rope_rows.
  int64_t rope_rows, rope_layout;
  const float* rope_cos;
  const float* rope_sin;
  const uint16_t* q;        // attention only: [batch, s_q, heads, d]
  const uint16_t* q_lora;   // fused: [batch, s_q, q_lora_rank]
  const uint16_t* w_uq;     // fused: [q_lora_rank, heads, nope + rope]
  const uint16_t* w_uk;     // fused: [heads, nope, kv_lora_rank]
  const uint16_t* w_uv;     // fused: [heads, kv_lora_rank, v_head_dim]
  const void* k_cache;      // [num_blocks, page, 1, width]: the variant's KV format's bytes
  const int32_t* block_table;   // [batch, max_blocks]
  const int32_t* seqlens;       // [batch]
  uint16_t* out;            // [batch, s_q, heads, dv] (fused: v_head_dim)
  float* lse;               // [batch, heads, s_q]
  // fp8_e4m3: value = stored * k_descale[descale_n == 1 ? 0 : sequence]; else unused
  const float* k_descale;
  int64_t descale_n;
  // attention = "sparse" (block_table and seqlens unused): query row (b, s) attends to the
  // slots page * page_size + offset its index lists name (negative: none), the main pool's
  // (k_cache, PAGE) then the extra pool's (extra_k_cache, EXTRA_PAGE), in one softmax;
  // topk_length [batch] (null: all) keeps each row's first entries of a list.
  const int32_t* indices;            // [batch, s_q, TOPK]
  const int32_t* topk_length;        // [batch] or null
  const void* extra_k_cache;         // [extra_num_blocks, EXTRA_PAGE, 1, width]
  const int32_t* extra_indices;      // [batch, s_q, EXTRA_TOPK]
  const int32_t* extra_topk_length;  // [batch] or null
  int64_t extra_num_blocks;
  const float* attn_sink;            // SINKS: [heads] fp32; out *= exp(lse) / (exp(lse) + exp(sink))
};

struct Sc11Result {
  sc11::Event* events;      // owned by the library: free with mlagen_sc11_free
  int64_t n_events;
  int64_t lmem_high;        // bytes, the most any core had allocated
  int64_t l2_high;          // bytes allocated in L2 (static + batch-dependent)
  int64_t l2_static;        // the multi-buffer slots (what the schedule check counts)
  int64_t lmem_capacity, l2_capacity;
  int64_t n_parts;          // partial results merged (seq / batch_seq schemes)
  int64_t copied_bytes;     // bytes the DMA copies moved (compute mode; 0 in dry mode)
};

// Returns 0 on success, 1 on an emulator error (protocol or capacity), 2 on bad arguments;
// the message goes to err.
int mlagen_sc11_run(const Sc11Args* args, int dry, Sc11Result* result, char* err, int errlen);
void mlagen_sc11_free(Sc11Result* result);
// Constants of the variant, for the loader to check it loaded what it expects.
const char* mlagen_sc11_variant();
int64_t mlagen_sc11_event_size();
}
