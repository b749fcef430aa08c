// The fused MLA decode operator on the emulated SC11 chip (and its attention-only variant).
//
//   phase A  (fused)  heads split over cores: q = q_lora W_UQ; q_lat = q_nope W_UK; RoPE on
//                     q_pe; absorbed q [b, s_q, h, d] to L2.                 barrier
//   phase B           attention on the paged latent cache, online softmax over blocks of
//                     BKV keys; SDMA gathers the next tile's pages DDR -> L2 slot while GDMA
//                     moves a slot L2 -> LMEM and BDC computes (BUFFERS slots).  barrier
//   merge   (split)   partials of a sequence cut over cores merged by lse.    barrier
//   phase C  (fused)  heads split over cores: out = o_lat W_UV.
//
// Cfg (from the generated .cpp) holds the variant's constants; see kernel.cpp.j2.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include <thread>
#include <vector>

#include "abi.h"
#include "machine.h"
#include "numeric.h"
#include "plan.h"

namespace sc11 {

enum Fault : int {
  FAULT_NONE = 0,
  FAULT_CAUSAL_OFF_BY_ONE = 1,
  FAULT_WRONG_SCALE = 2,
  FAULT_SKIP_PARTIAL_PAGE = 3,
  FAULT_BAD_SPLIT_MERGE = 4,
  FAULT_EARLY_BUFFER_SWAP = 5,
  // faults in the paths the default examples miss (tests/test_sc11_paths.py)
  FAULT_PROJ_FIRST_CHUNK_ONLY = 6,   // phases A and C stop after the first 128 token rows
  FAULT_IGNORE_SOFTMAX_SCALE = 7,    // the convention's default scale, not the caller's
  FAULT_PAGE_START_ASSUMED = 8,      // a gather assumes its tile starts on a page boundary
  FAULT_EMPTY_PARTIAL_UNMASKED = 9,  // the merge weighs a partial that saw nothing as lse 0
  FAULT_DEFAULT_HEAD_SPLIT = 10,     // phases A/C give a core heads / cores heads, not HPC
  // faults in the dequantization of 8-bit KV formats
  FAULT_KV_SCALE_TWICE = 11,         // a KV scale applied twice (descale / tile scale)
  FAULT_KV_SCALE_WRONG_TILE = 12,    // fp8_ds_mla: a tile takes the next tile's scale
  FAULT_DESCALE_NOT_IN_OUTPUT = 13,  // fp8_e4m3: k_descale in the scores, not in the output
                                     // (planted in the Hopper kernels alone)
  // faults in the token-sparse path (attention = "sparse")
  FAULT_SPARSE_OFFSET_OFF_BY_ONE = 14,   // a slot's offset within its page taken one further
  FAULT_SPARSE_INVALID_READ = 15,        // a negative (invalid) entry read as slot 0
  FAULT_SPARSE_TOPK_LENGTH_PLUS_ONE = 16,  // topk_length + 1 entries of a list kept
  FAULT_SINK_IN_LSE = 17,                // the sink also added into the lse
  FAULT_SINK_SIGN = 18,                  // the output scaled with exp(-sink)
  FAULT_EXTRA_PAGE_FOR_MAIN = 19,        // the main pool's slots split by the extra pool's page
};

// How the cache stores a token (mlagen/kvformat.py): the variant's KV_FORMAT.
enum KvFormat : int {
  KV_PLAIN = 0,    // D values in the dtype (bf16 / fp16)
  KV_E4M3 = 1,     // D e4m3 values; value = stored * k_descale (per cache or per sequence)
  KV_DS_MLA = 2,   // DV e4m3 latent values, DV / 128 fp32 scales, ROPE bf16 values
  // fp8_ue8m0_paged, page-major: a page holds every token's data row (LAT e4m3, ROPE bf16)
  // and then every token's scale row (LAT / 64 UE8M0 bytes, 2^(byte - 127), and one pad
  // byte), the page padded to a multiple of 576 bytes.  A gathered token is packed in L2 as
  // its data row followed by its scale row (KV_BYTES).
  KV_UE8M0_PAGED = 3,
};
constexpr int kDsTile = 128;      // latent values per fp8_ds_mla scale
constexpr int kPagedTile = 64;    // latent values per fp8_ue8m0_paged scale
constexpr int64_t kPagedAlign = 576;   // fp8_ue8m0_paged pages are padded to this multiple

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

template <class Cfg>
class Mla {
  using T = typename Cfg::T;
  static constexpr int H = Cfg::HEADS, D = Cfg::D, DV = Cfg::DV, ROPE = Cfg::ROPE,
                       NOPE = Cfg::NOPE, VH = Cfg::VHEAD, R = Cfg::QLORA, PAGE = Cfg::PAGE,
                       BKV = Cfg::BKV, NBUF = Cfg::BUFFERS, CORES = Cfg::CORES,
                       HPC = Cfg::HPC, PR = Cfg::PROJ_ROWS;
  static constexpr int64_t TILE = Cfg::SEQ_TILE;
  static constexpr int EL = 2;  // bytes of a bf16 / fp16 value
  static constexpr int KVF = Cfg::KV_FORMAT;
  static constexpr int64_t KVB = Cfg::KV_BYTES;   // bytes of one cached token
  static constexpr bool QUANT = KVF != KV_PLAIN;
  static constexpr int LAT = D - ROPE;            // latent values of a key (kv_lora_rank)
  static_assert(KVF != KV_PLAIN || KVB == (int64_t)D * EL, "a plain token is D 16-bit values");
  static_assert(KVF != KV_E4M3 || KVB == D, "an e4m3 token is D bytes");
  static_assert(KVF != KV_DS_MLA || (LAT % kDsTile == 0 && KVB == LAT + 4 * (LAT / kDsTile) + 2 * ROPE),
                "an fp8_ds_mla token is LAT e4m3, LAT / 128 fp32 scales and ROPE bf16 values");
  static constexpr bool PAGED = KVF == KV_UE8M0_PAGED;
  static constexpr int64_t ROW_B = LAT + 2 * ROPE;        // paged: a token's data row
  static constexpr int64_t SCALE_B = LAT / kPagedTile + 1;  // paged: its scale row
  static_assert(!PAGED || (LAT % kPagedTile == 0 && KVB == ROW_B + SCALE_B),
                "an fp8_ue8m0_paged token is a data row (LAT e4m3, ROPE bf16) and LAT / 64 + 1 scale bytes");
  // token-sparse: a "sequence" of phase B is one query row (b, s) and its keys are the
  // valid entries of its index lists (main pool, then extra pool), gathered token by token
  static constexpr bool SPARSE = Cfg::SPARSE, SINKS = Cfg::SINKS;
  static constexpr int TOPK = Cfg::TOPK, XTOPK = Cfg::EXTRA_TOPK, XPAGE = Cfg::EXTRA_PAGE;
  static_assert(!SPARSE || KVF != KV_E4M3, "the sparse path reads 16-bit, fp8_ds_mla and paged pools");
  static_assert(!PAGED || SPARSE, "fp8_ue8m0_paged pools are read by the sparse path only");

  // Per-core buffers (LMEM rings are re-laid out at each phase; L2 rings live throughout).
  struct Bufs {
    Ring l2kv;                 // phase B: SDMA-gathered KV tiles in L2
    Ring q, kv, out, mrg;      // phase B / merge, LMEM
    Ring w, pin, pout;         // phases A and C, LMEM
    int64_t work = 0, pwork = 0;
    std::vector<int64_t> idx_free;           // sparse: the SDMA that last read each index entry
    int64_t steps = 0, outs = 0, mrgs = 0;   // slot step counters
  };

 public:
  Mla(const Sc11Args& a, bool dry) : a_(a), dry_(dry) {}

  void run(Sc11Result* res) {
    validate();
    int threads = (int)a_.threads;
    if (threads <= 0) threads = (int)std::max(1u, std::thread::hardware_concurrency());
    chip_.init(CORES, Cfg::LMEM_BYTES, Cfg::LMEM_GRANULE, Cfg::L2_BYTES, Cfg::L2_GRANULE, dry_,
               threads);
    bufs_.assign(CORES, Bufs{});
    deq_off_.assign(CORES, 0);
    ds_off_.assign(CORES, 0);
    idx_off_.assign(CORES, 0);
    sink_off_.assign(CORES, 0);
    rows_ = (int)sq() * H;
    kv_len_.resize(nseq());
    for (int64_t b = 0; b < nseq(); ++b)
      kv_len_[b] = SPARSE ? entries(b, 0) + entries(b, 1) : keys_read(a_.seqlens[b]);
    plan_ = make_plan((int)a_.scheme, kv_len_, H, CORES, HPC, BKV);

    // L2: every core's KV slots (static, the schedule check counts these) ...
    for (int c = 0; c < CORES; ++c) {
      Bufs& B = bufs_[c];
      B.l2kv.slots.assign(NBUF, Slot{});
      for (int i = 0; i < NBUF; ++i) {
        B.l2kv.slots[i].name = "L2 kv slot";
        B.l2kv.slots[i].index = i;
        B.l2kv.slots[i].mem = L2;
        B.l2kv.slots[i].bytes = TILE * KVB;
        B.l2kv.slots[i].off = chip_.l2.alloc(TILE * KVB, "a KV tile slot");
      }
      chip_.cores[c].rings.push_back(&B.l2kv);
    }
    const int64_t l2_static = chip_.l2.used();
    // ... and what depends on the batch: q and o_lat (fused), partials (split schemes)
    const int64_t tokens = a_.batch * a_.s_q;
    if (Cfg::FUSED) {
      q_l2_ = chip_.l2.alloc(tokens * H * D * EL, "the absorbed q of the batch");
      o_l2_ = chip_.l2.alloc(tokens * H * DV * EL, "the latent output of the batch");
    }
    if (plan_.n_parts)
      part_l2_ = chip_.l2.alloc(plan_.n_parts * part_bytes(), "the partial results of split sequences");
    chip_.l2.commit();

    if (Cfg::FUSED) {
      chip_.phase(PH_A, [&](Core& c) { phase_a(c); });
      chip_.barrier(PH_A);
    }
    chip_.phase(PH_B, [&](Core& c) { phase_b(c); });
    if (plan_.n_parts) {
      chip_.barrier(PH_B);
      chip_.phase(PH_MERGE, [&](Core& c) { merge(c); });
    }
    if (Cfg::FUSED) {
      chip_.barrier(plan_.n_parts ? PH_MERGE : PH_B);
      chip_.phase(PH_C, [&](Core& c) { phase_c(c); });
    }

    res->n_events = (int64_t)chip_.trace.size();
    res->events = new Event[chip_.trace.size() ? chip_.trace.size() : 1];
    std::copy(chip_.trace.begin(), chip_.trace.end(), res->events);
    res->lmem_high = 0;
    for (auto& c : chip_.cores) res->lmem_high = std::max(res->lmem_high, c.lmem.high());
    res->l2_high = chip_.l2.high();
    res->l2_static = l2_static;
    res->lmem_capacity = Cfg::LMEM_BYTES;
    res->l2_capacity = Cfg::L2_BYTES;
    res->n_parts = plan_.n_parts;
    res->copied_bytes = 0;
    for (auto& c : chip_.cores) res->copied_bytes += c.copied;
  }

 private:
  const Sc11Args& a_;
  bool dry_;
  Chip chip_;
  std::vector<Bufs> bufs_;
  Plan plan_;
  std::vector<int64_t> kv_len_;
  int rows_ = 0;
  int64_t q_l2_ = 0, o_l2_ = 0, part_l2_ = 0;
  // phase B's LMEM scratch of 8-bit formats (offsets per core): the BDC's dequantized
  // 16-bit block the cube reads, and fp8_e4m3's descales (one GDMA at the phase's start)
  std::vector<int64_t> deq_off_, ds_off_;

  // per core: phase B's LMEM index ring (sparse: one TILE of entries per buffer) and sinks
  std::vector<int64_t> idx_off_, sink_off_;

  int64_t part_bytes() const { return (int64_t)rows_ * (DV + 1) * 4; }
  // Query rows of a phase-B sequence, and the sequences (sparse: every (b, s) row alone).
  int64_t sq() const { return SPARSE ? 1 : a_.s_q; }
  int64_t nseq() const { return SPARSE ? a_.batch * a_.s_q : a_.batch; }
  // lse's place [batch, heads, s_q] of phase-B sequence `seq`, query row q, head h
  int64_t lse_at(int64_t seq, int q, int h) const {
    if (SPARSE) return (seq / a_.s_q * H + h) * a_.s_q + seq % a_.s_q;
    return ((int64_t)seq * H + h) * a_.s_q + q;
  }

  // ---- the sparse index path ----------------------------------------------------------
  // Entries of list `pool` (0 main, 1 extra) that row v keeps: topk_length's prefix.
  int64_t entries(int64_t v, int pool) const {
    const int64_t n = pool ? XTOPK : TOPK;
    const int32_t* tl = pool ? a_.extra_topk_length : a_.topk_length;
    if (!n || !tl) return n;
    int64_t keep = tl[v / a_.s_q];
    if (Cfg::FAULT == FAULT_SPARSE_TOPK_LENGTH_PLUS_ONE) ++keep;
    return std::max<int64_t>(0, std::min(n, keep));
  }
  // Entry e of row v's key list -> (pool, slot); false for an invalid (negative) entry.
  bool entry(int64_t v, int64_t e, int& pool, int64_t& slot) const {
    const int64_t nm = entries(v, 0);
    pool = e < nm ? 0 : 1;
    slot = pool ? a_.extra_indices[v * XTOPK + (e - nm)] : a_.indices[v * TOPK + e];
    if (slot < 0 && Cfg::FAULT == FAULT_SPARSE_INVALID_READ) slot = 0;
    return slot >= 0;
  }
  // Bytes of one page of a pool of page size pg (paged: padded to a multiple of 576).
  static int64_t page_bytes(int64_t pg) {
    return PAGED ? (pg * KVB + kPagedAlign - 1) / kPagedAlign * kPagedAlign : pg * KVB;
  }
  // The bytes of a pool's slot: its page (a pool's own page size) and the offset in it;
  // paged: the token's data row, and its scale row through `scales`.
  const uint8_t* token(int pool, int64_t slot, const uint8_t** scales = nullptr) const {
    const int64_t pg = pool ? XPAGE : PAGE;
    const int64_t own = pg;   // a slot splits into page and offset by its own pool's page
    const int64_t split = !pool && Cfg::FAULT == FAULT_EXTRA_PAGE_FOR_MAIN ? XPAGE : own;
    int64_t page = slot / split, off = slot % split;
    if (Cfg::FAULT == FAULT_SPARSE_OFFSET_OFF_BY_ONE) off = (off + 1) % split;
    const int64_t cap = (pool ? a_.extra_num_blocks : a_.num_blocks) * pg;
    // validate() checked every slot; only a planted fault's address can leave the cache,
    // and it wraps (reads another token) instead of leaving the emulator's memory
    const int64_t at = ((page * pg + off) % cap + cap) % cap;
    const uint8_t* base = (const uint8_t*)(pool ? a_.extra_k_cache : a_.k_cache);
    if (!PAGED) return base + at * KVB;
    const uint8_t* pg0 = base + at / pg * page_bytes(pg);
    const int64_t row = at % pg;
    if (scales) *scales = pg0 + pg * ROW_B + row * SCALE_B;   // after the page's data rows
    return pg0 + row * ROW_B;
  }
  int64_t valid_in(int64_t v, int64_t t0, int64_t t1) const {
    int64_t n = 0, slot;
    int pool;
    for (int64_t e = t0; e < t1; ++e) n += entry(v, e, pool, slot);
    return n;
  }
  // fp32 sink of head h (LMEM copy); the factor exp(lse) / (exp(lse) + exp(sink)) of a
  // row's output.  +inf lse (no key) keeps the 0 output.
  float sink_factor(Core& c, int h, float lse) const {
    const float sk = ((const float*)c.lmem.at(sink_off_[c.id]))[h];
    const float sg = Cfg::FAULT == FAULT_SINK_SIGN ? -sk : sk;
    if (lse == std::numeric_limits<float>::infinity()) return 0.f;
    return 1.f / (1.f + std::exp(sg - lse));
  }
  // The lse a row reports: its keys' alone (the sink scales the output, not the lse);
  // `joint` would count the sink as one more key.
  float sink_lse(Core& c, int h, float lse) const {
    if (lse == std::numeric_limits<float>::infinity()) return lse;
    const float sk = ((const float*)c.lmem.at(sink_off_[c.id]))[h];
    const float m = std::max(lse, sk);
    const float joint = m == kNegInf ? lse : m + std::log(std::exp(lse - m) + std::exp(sk - m));
    const float keys = lse;
    return Cfg::FAULT == FAULT_SINK_IN_LSE ? joint : keys;
  }
  // GDMA: the sinks DDR -> LMEM (kNone without sinks).
  int64_t load_sinks(Core& c) {
    if (!SINKS) return kNone;
    Core::Copy cp(c);
    cp(c.wr(c.lmem, LMEM, sink_off_[c.id], (int64_t)H * 4), a_.attn_sink, (int64_t)H * 4);
    return c.dma(GDMA, DDR, LMEM, cp, {});
  }

  [[noreturn]] static void arg_fail(const char* msg, long long v) {
    char buf[256];
    std::snprintf(buf, sizeof buf, msg, v);
    throw ArgError(buf);
  }

  // The C side trusts nothing: the Python runner checks the same with better messages.
  void validate() const {
    if (a_.batch < 1) arg_fail("batch = %lld must be >= 1", a_.batch);
    if (a_.s_q < 1 || a_.s_q > Cfg::MAX_SQ) arg_fail("s_q = %lld out of range", a_.s_q);
    if (a_.scheme < SCHEME_HEADS || a_.scheme > SCHEME_BATCH_SEQ) arg_fail("unknown scheme %lld", a_.scheme);
    if (!a_.k_cache || (!SPARSE && (!a_.block_table || !a_.seqlens)) || (!dry_ && (!a_.out || !a_.lse)))
      arg_fail("a required pointer is null (%lld)", 0);
    if (SPARSE) {
      validate_sparse();
      return;
    }
    if (Cfg::FUSED ? (!a_.q_lora || !a_.w_uq || !a_.w_uk || !a_.w_uv) : !a_.q)
      arg_fail("a required input pointer is null (%lld)", 0);
    if (KVF == KV_E4M3 && (!a_.k_descale || (a_.descale_n != 1 && a_.descale_n != a_.batch)))
      arg_fail("an fp8_e4m3 cache needs k_descale of 1 or batch entries (got %lld)", a_.descale_n);
    if (Cfg::FUSED && !dry_ && (!a_.rope_cos || !a_.rope_sin || a_.rope_layout < 0 || a_.rope_layout > 1))
      arg_fail("the rotary table is missing or its layout %lld unknown", a_.rope_layout);
    for (int64_t b = 0; b < a_.batch; ++b) {
      const int64_t L = a_.seqlens[b];
      if (L < 0 || L > a_.max_blocks * PAGE) arg_fail("cache_seqlens entry %lld out of range", b);
      if (Cfg::FUSED && !dry_ && L > a_.rope_rows) arg_fail("sequence %lld has positions past the rotary table", b);
      if (Cfg::FUSED && !dry_ && !a_.causal && L > 0 && a_.s_q - L >= a_.rope_rows)
        arg_fail("sequence %lld has a negative position past the rotary table", b);
      const int64_t used = (keys_read(L) + PAGE - 1) / PAGE;
      for (int64_t j = 0; j < used; ++j) {
        const int32_t blk = a_.block_table[b * a_.max_blocks + j];
        if (blk < 0 || blk >= a_.num_blocks) arg_fail("block_table entry of sequence %lld out of range", b);
      }
    }
  }

  void validate_sparse() const {
    if (!a_.indices || (XTOPK && (!a_.extra_indices || !a_.extra_k_cache)) || (SINKS && !a_.attn_sink))
      arg_fail("a sparse input pointer is null (%lld)", 0);
    if (Cfg::FUSED) {  // phase A: q_lora, the weights, and each row's position from seqlens
      if (!a_.q_lora || !a_.w_uq || !a_.w_uk || !a_.w_uv || !a_.seqlens)
        arg_fail("a fused input pointer is null (%lld)", 0);
      if (!dry_ && (!a_.rope_cos || !a_.rope_sin || a_.rope_layout < 0 || a_.rope_layout > 1))
        arg_fail("the rotary table is missing or its layout %lld unknown", a_.rope_layout);
      for (int64_t b = 0; b < a_.batch; ++b)
        if (a_.seqlens[b] < a_.s_q || (!dry_ && a_.seqlens[b] > a_.rope_rows))
          arg_fail("cache_seqlens of sequence %lld: its query positions leave [0, the rotary table)", b);
    } else if (!a_.q) {
      arg_fail("a required input pointer is null (%lld)", 0);
    }
    for (int pool = 0; pool < (XTOPK ? 2 : 1); ++pool) {
      const int32_t* idx = pool ? a_.extra_indices : a_.indices;
      const int32_t* tl = pool ? a_.extra_topk_length : a_.topk_length;
      const int64_t n = (pool ? XTOPK : TOPK) * a_.batch * a_.s_q;
      const int64_t cap = (pool ? a_.extra_num_blocks * XPAGE : a_.num_blocks * PAGE);
      for (int64_t i = 0; i < n; ++i)
        if (idx[i] >= cap) arg_fail("an index names slot %lld, past its pool", idx[i]);
      if (tl)
        for (int64_t b = 0; b < a_.batch; ++b)
          if (tl[b] < 0) arg_fail("topk_length of row %lld is negative", b);
    }
  }

  // Keys of a sequence the kernel reads: [0, L), or what a planted fault makes of it.
  int64_t keys_read(int64_t L) const {
    if (Cfg::FAULT == FAULT_SKIP_PARTIAL_PAGE) return L / PAGE * PAGE;
    if (Cfg::FAULT == FAULT_CAUSAL_OFF_BY_ONE) return std::min(L + 1, a_.max_blocks * PAGE);
    return L;
  }
  // The last key row r of sequence b may see (causal, bottom-right aligned).
  int64_t visible_limit(int b, int s) const {
    if (!a_.causal) return std::numeric_limits<int64_t>::max();
    const int64_t pos = a_.seqlens[b] - a_.s_q + s;
    return Cfg::FAULT == FAULT_CAUSAL_OFF_BY_ONE ? pos + 1 : pos;
  }
  float scale() const {
    if (Cfg::FAULT == FAULT_IGNORE_SOFTMAX_SCALE)
      return (float)(1.0 / std::sqrt((double)(Cfg::FUSED ? NOPE + ROPE : D)));
    return (float)(Cfg::FAULT == FAULT_WRONG_SCALE ? a_.scale * 1.01 : a_.scale);
  }

  void lay_out_b(Core& c) {
    Bufs& B = bufs_[c.id];
    c.lmem.reset();
    c.rings.resize(1);  // keep the L2 ring
    c.make_ring(B.q, "LMEM q slot", NBUF, (int64_t)rows_ * D * EL);
    c.make_ring(B.kv, "LMEM kv slot", NBUF, TILE * KVB);
    // one output slot: its store overlaps the next piece's compute, which refills it only
    // when that piece ends
    c.make_ring(B.out, "LMEM out slot", 1, (int64_t)rows_ * (DV + 1) * 4);
    // scores of one block, the O accumulator, running max and sum
    B.work = c.lmem.alloc((int64_t)rows_ * (BKV + DV + 2) * 4, "the attention work buffer");
    if (QUANT) deq_off_[c.id] = c.lmem.alloc((int64_t)BKV * D * EL, "the dequantized KV block");
    if (KVF == KV_E4M3) ds_off_[c.id] = c.lmem.alloc(a_.descale_n * 4, "the KV descales");
    if (SPARSE) idx_off_[c.id] = c.lmem.alloc(NBUF * TILE * 4, "the index ring");
    if (SINKS) sink_off_[c.id] = c.lmem.alloc((int64_t)H * 4, "the sinks");
    c.lmem.commit();
  }

  // GDMA: fp8_e4m3's descales DDR -> LMEM, once per core (the event the first BDC work
  // waits for; kNone for other formats).
  int64_t load_descale(Core& c) {
    if (KVF != KV_E4M3) return kNone;
    Core::Copy cp(c);
    cp(c.wr(c.lmem, LMEM, ds_off_[c.id], a_.descale_n * 4), a_.k_descale, a_.descale_n * 4);
    return c.dma(GDMA, DDR, LMEM, cp, {});
  }
  // fp8_e4m3: the descale of sequence b, folded into its scores and its output (1 else).
  float descale(Core& c, int b) const {
    if (KVF != KV_E4M3 || dry_) return 1.0f;
    const float* ds = (const float*)c.lmem.at(ds_off_[c.id]);
    return ds[a_.descale_n == 1 ? 0 : b];
  }

  // ------------------------------------------------------------------ phase B ----------
  struct Step {
    int piece;
    int64_t t0, t1;   // key range (sparse: entries of the row's lists)
    bool first, last;
    int64_t nv = 0;   // keys the step reads (sparse: its valid entries, gathered packed)
  };

  void phase_b(Core& c) {
    lay_out_b(c);
    Bufs& B = bufs_[c.id];
    const auto& pieces = plan_.per_core[c.id];
    std::vector<Step> steps;
    for (int p = 0; p < (int)pieces.size(); ++p) {
      const Piece& pc = pieces[p];
      if (pc.t1 <= pc.t0) {
        steps.push_back({p, pc.t0, pc.t0, true, true, 0});
        continue;
      }
      for (int64_t t = pc.t0; t < pc.t1; t += TILE) {
        const int64_t t1 = std::min(pc.t1, t + TILE);
        steps.push_back({p, t, t1, t == pc.t0, t + TILE >= pc.t1,
                         SPARSE ? valid_in(pc.seq, t, t1) : t1 - t});
      }
    }
    // KV steps (those with keys) are numbered k = 0..nk-1; slot of step k is k % NBUF
    std::vector<int64_t> kstep(steps.size(), -1);
    int64_t nk = 0;
    for (size_t i = 0; i < steps.size(); ++i)
      if (steps[i].nv > 0) kstep[i] = nk++;
    std::vector<size_t> step_of_k;
    for (size_t i = 0; i < steps.size(); ++i)
      if (kstep[i] >= 0) step_of_k.push_back(i);

    Scratch sc;
    sc.init(rows_);
    int64_t ds_ev = SINKS ? load_sinks(c) : load_descale(c);
    B.idx_free.assign(NBUF, kNone);
    for (int64_t k = 0; k < std::min<int64_t>(NBUF - 1, nk); ++k)
      sdma_gather(c, B, pieces[steps[step_of_k[k]].piece], steps[step_of_k[k]], B.steps + k);
    // GDMA is one in-order queue: a piece's output store is issued after the next step's
    // tile load, so the load is not queued behind the store (the store waits for BDC's
    // normalisation, which waits for the piece's last compute).
    const Piece* pending = nullptr;
    int64_t pending_o = -1;
    auto flush = [&] {
      if (pending) store(c, B.out[pending_o], pending_o, pending->seq, pending->h0, pending->h1,
                         pending->part >= 0 ? pending->part : -1);
      pending = nullptr;
    };
    for (size_t i = 0; i < steps.size(); ++i) {
      const Step& st = steps[i];
      const Piece& pc = pieces[st.piece];
      if (st.first) {
        init_acc(c, pc, ds_ev);
        ds_ev = kNone;   // later BDC work is behind it in the queue
      }
      // sparse: a tile of entries that are all invalid is read (its indices) and skipped
      if (SPARSE && kstep[i] < 0 && st.t1 > st.t0) load_indices(c, pc, st, 0);
      if (kstep[i] >= 0) {
        const int64_t k = kstep[i];
        if (k + NBUF - 1 < nk) {
          const Step& ahead = steps[step_of_k[k + NBUF - 1]];
          sdma_gather(c, B, pieces[ahead.piece], ahead, B.steps + k + NBUF - 1);
        }
        gdma_load(c, B, pc, st, B.steps + k);
        flush();
        compute(c, B, pc, st, B.steps + k, sc);
      }
      if (st.last) {
        flush();   // the out slot is refilled only after its previous store
        pending_o = finalize(c, B, pc);
        pending = &pc;
      }
    }
    flush();
    B.steps += nk;
  }

  // GDMA: row pc.seq's entries [t0, t1) DDR -> the LMEM index ring (the core writes the
  // gather's descriptors from them).  Ring entry i is refilled after the SDMA of the step
  // that used it last.
  std::vector<int64_t>& idx_free(Core& c) { return bufs_[c.id].idx_free; }
  int64_t load_indices(Core& c, const Piece& pc, const Step& st, int64_t step) {
    const int64_t v = pc.seq, nm = entries(v, 0), ring = step % NBUF;
    int32_t* dst = (int32_t*)c.wr(c.lmem, LMEM, idx_off_[c.id] + ring * TILE * 4, (st.t1 - st.t0) * 4);
    Core::Copy cp(c);
    if (st.t0 < nm)
      cp(dst, a_.indices + v * TOPK + st.t0, (std::min(st.t1, nm) - st.t0) * 4);
    if (st.t1 > nm) {
      const int64_t e0 = std::max(st.t0, nm);
      cp(dst ? dst + (e0 - st.t0) : nullptr, a_.extra_indices + v * XTOPK + (e0 - nm), (st.t1 - e0) * 4);
    }
    return c.dma(GDMA, DDR, LMEM, cp, {idx_free(c)[ring]});
  }

  // SDMA, sparse: the step's valid entries, in list order, from their pools' pages DDR ->
  // packed in the L2 slot.  GATHER_RUNS: a run of entries naming adjacent slots of one page
  // (a window, a cluster) is one descriptor; else a descriptor a token.  Paged: a token is
  // two pieces of its page, its data row and its scale row, so a run is two strided
  // descriptors (the page's data rows, then its scale rows, into the packed tokens).
  void sdma_gather_sparse(Core& c, Bufs& B, const Piece& pc, const Step& st, int64_t step) {
    Slot& s = B.l2kv[step];
    const int64_t dep = c.begin_fill(s, step);
    const int64_t ev_idx = load_indices(c, pc, st, step);
    uint8_t* dst = c.wr(chip_.l2, L2, s.off, st.nv * KVB);
    Core::Copy cp(c);
    int64_t n = 0, slot;
    int pool;
    for (int64_t e = st.t0; e < st.t1;) {
      if (!entry(pc.seq, e, pool, slot)) {
        ++e;
        continue;
      }
      const int64_t len = Cfg::GATHER_RUNS ? run_length(pc.seq, e, st.t1, pool, slot) : 1;
      const uint8_t* base = (const uint8_t*)(pool ? a_.extra_k_cache : a_.k_cache);
      const int64_t pg = pool ? XPAGE : PAGE;
      const int64_t span = (pool ? a_.extra_num_blocks : a_.num_blocks) * page_bytes(pg);
      uint8_t* d = dst ? dst + n * KVB : nullptr;
      if (PAGED) {
        const uint8_t* scales = nullptr;
        const uint8_t* row = token(pool, slot, &scales);
        cp.rows(d, KVB, base, span, row, ROW_B, ROW_B, len);
        cp.rows(d ? d + ROW_B : nullptr, KVB, base, span, scales, SCALE_B, SCALE_B, len);
      } else {
        cp.rows(d, KVB, base, span, token(pool, slot), KVB, KVB, len);
      }
      n += len;
      e += len;
    }
    const int64_t ev = c.gather(SDMA, DDR, L2, cp, {dep, ev_idx});
    idx_free(c)[step % NBUF] = ev;
    c.end_fill(s, step, ev);
  }
  // Entries [e, e + len) of row v (below t1) naming slot, slot + 1, ... of one page of one
  // pool: a run one descriptor moves.  A repeated slot is a separate key, not adjacent.
  int64_t run_length(int64_t v, int64_t e, int64_t t1, int pool, int64_t slot) const {
    const int64_t pg = pool ? XPAGE : PAGE;
    const int64_t room = pg - slot % pg;   // slots left in slot's page
    int64_t len = 1, next;
    int p;
    while (e + len < t1 && len < room && entry(v, e + len, p, next) && p == pool &&
           next == slot + len)
      ++len;
    return len;
  }

  // SDMA: the pages holding keys [t0, t1) of one sequence, DDR -> contiguous L2 slot.
  void sdma_gather(Core& c, Bufs& B, const Piece& pc, const Step& st, int64_t step) {
    if (SPARSE) return sdma_gather_sparse(c, B, pc, st, step);
    Slot& s = B.l2kv[step];
    const int64_t dep = c.begin_fill(s, step);
    const int64_t n = st.t1 - st.t0;
    uint8_t* dst = c.wr(chip_.l2, L2, s.off, n * KVB);
    const uint8_t* cache = (const uint8_t*)a_.k_cache;
    Core::Copy cp(c);
    for (int64_t t = st.t0; t < st.t1;) {
      const int64_t page = t / PAGE, len0 = std::min<int64_t>(PAGE - t % PAGE, st.t1 - t);
      const int64_t in = Cfg::FAULT == FAULT_PAGE_START_ASSUMED ? 0 : t % PAGE;
      const int64_t len = Cfg::FAULT == FAULT_PAGE_START_ASSUMED ? len0 : std::min<int64_t>(PAGE - in, st.t1 - t);
      const int64_t blk = a_.block_table[pc.seq * a_.max_blocks + page];
      cp(dst + (t - st.t0) * KVB, cache + (blk * PAGE + in) * KVB, len * KVB);
      t += len;
    }
    const int64_t ev = c.dma(SDMA, DDR, L2, cp, {dep});
    c.end_fill(s, step, ev);
  }

  // GDMA: the KV tile L2 -> LMEM and the piece's q rows (DDR, or L2 when fused) -> LMEM.
  void gdma_load(Core& c, Bufs& B, const Piece& pc, const Step& st, int64_t step) {
    Slot& l2 = B.l2kv[step];
    Slot& kv = B.kv[step];
    Slot& q = B.q[step];
    const int64_t ready = c.wait(l2, step);
    const int64_t n = st.nv;
    const int64_t dep_kv = c.begin_fill(kv, step);
    Core::Copy ckv(c);
    ckv(c.wr(c.lmem, LMEM, kv.off, n * KVB), c.rd(chip_.l2, L2, l2.off, n * KVB), n * KVB);
    const int64_t ev_kv = c.dma(GDMA, L2, LMEM, ckv, {ready, dep_kv});
    c.end_fill(kv, step, ev_kv);
    const int64_t dep_q = c.begin_fill(q, step);
    const int nh = pc.h1 - pc.h0;
    uint16_t* dst = (uint16_t*)c.wr(c.lmem, LMEM, q.off, sq() * nh * D * EL);
    const uint16_t* src = Cfg::FUSED ? (const uint16_t*)c.rd(chip_.l2, L2, q_l2_, 0) : a_.q;
    Core::Copy cq(c);
    for (int s = 0; s < sq(); ++s)
      cq(dst + (int64_t)s * nh * D, src + (((int64_t)pc.seq * sq() + s) * H + pc.h0) * D,
         (int64_t)nh * D * EL);
    const int64_t ev_q = c.dma(GDMA, Cfg::FUSED ? L2 : DDR, LMEM, cq, {dep_q});
    c.end_fill(q, step, ev_q);
  }

  // Host-side fp32 copies the emulated BDC computes on (it reads 16-bit LMEM data with
  // fp32 accumulation; these conversions are the emulator's, not the card's, so they are
  // not counted in LMEM).
  struct Scratch {
    std::vector<float> qf, kt, v, row;
    void init(int rows) {
      qf.assign((size_t)rows * D, 0.f);
      row.assign((size_t)D, 0.f);
      kt.assign((size_t)D * BKV, 0.f);
      v.assign((size_t)BKV * DV, 0.f);
    }
  };

  float* scores(Core& c) { return (float*)c.lmem.at(bufs_[c.id].work); }
  float* acc(Core& c) { return scores(c) + (int64_t)rows_ * BKV; }
  float* mx(Core& c) { return acc(c) + (int64_t)rows_ * DV; }
  float* sm(Core& c) { return mx(c) + rows_; }

  void init_acc(Core& c, const Piece& pc, int64_t dep) {
    const int rows = (pc.h1 - pc.h0) * (int)sq();
    if (!dry_) {
      std::fill(acc(c), acc(c) + (int64_t)rows * DV, 0.f);
      std::fill(mx(c), mx(c) + rows, kNegInf);
      std::fill(sm(c), sm(c) + rows, 0.f);
    }
    c.emit(BDC, OP_VECTOR, LMEM, LMEM, 0, 0, 0, 0, (int64_t)rows * (DV + 2), -1, {dep});
  }

  // BDC: online softmax over blocks of BKV keys of the tile in the LMEM slot.
  void compute(Core& c, Bufs& B, const Piece& pc, const Step& st, int64_t step, Scratch& sc) {
    const int nh = pc.h1 - pc.h0, rows = nh * (int)sq();
    const int64_t w_kv = c.wait(B.kv[step], step);
    const int64_t w_q = c.wait(B.q[step], step);
    // the planted early_buffer_swap reads the slot of the next step (the address check in
    // Core::rd sees a slot that is free or being filled)
    const int64_t rs = Cfg::FAULT == FAULT_EARLY_BUFFER_SWAP ? step + 1 : step;
    const int64_t n = st.nv;
    const uint8_t* kv = c.rd(c.lmem, LMEM, B.kv[rs].off, n * KVB);
    c.check_read(B.kv[step], step);
    c.check_read(B.q[step], step);
    const uint16_t* q = (const uint16_t*)c.rd(c.lmem, LMEM, B.q[step].off, (int64_t)rows * D * EL);
    if (!dry_) to_f32<T>(q, sc.qf.data(), (int64_t)rows * D);
    // fp8_e4m3: q (k_stored * ds) = ds (q k_stored), so the descale scales the scores
    const float ds = descale(c, pc.seq);
    const float scl = scale() * ds;
    std::vector<int64_t> lim(rows);
    for (int r = 0; r < rows; ++r) lim[r] = visible_limit(pc.seq, r / nh);
    int64_t last = kNone;
    bool first = true;
    // the tile's keys in order (sparse: packed valid entries; causal is off, nothing masked)
    const int64_t k0 = SPARSE ? 0 : st.t0, k1 = k0 + n;
    for (int64_t j0 = k0; j0 < k1; j0 += BKV) {
      const int nb = (int)std::min<int64_t>(BKV, k1 - j0);
      if (!dry_) block(c, kv + (j0 - k0) * KVB, nb, j0, rows, lim.data(), scl, ds, sc);
      std::initializer_list<int64_t> deps = {w_kv, w_q};
      const std::initializer_list<int64_t> none{};
      if (QUANT)   // the block's 8-bit values into the cube's 16-bit tile
        c.emit(BDC, OP_DEQUANT, LMEM, LMEM, 0, 0, (int64_t)nb * D, 0, dequant_ops(nb),
               B.kv[step].index, first ? deps : none);
      c.emit(BDC, OP_MATMUL, LMEM, LMEM, 0, rows, nb, D, 0, B.kv[step].index,
             first && !QUANT ? deps : none);
      c.emit(BDC, OP_VECTOR, LMEM, LMEM, 0, 0, 0, 0, (int64_t)rows * nb + (int64_t)rows * DV,
             B.kv[step].index, {});
      // P stays fp32 into P V (rounding it to 16 bits moves out beyond the oracle's bf16
      // tolerance on small blocks): elems = 4 charges the cube's fp32 rate for it
      last = c.emit(BDC, OP_MATMUL, LMEM, LMEM, 0, rows, DV, nb, 4, B.kv[step].index, {});
      first = false;
    }
    c.release(B.q[step], step, last);
    c.release(B.kv[step], step, last);
    c.release(B.l2kv[step], step, last);  // the stage (L2 + LMEM slot) frees when BDC is done
  }

  // Vector operations the BDC spends turning nb tokens into 16-bit values: one conversion a
  // value (fp8_ds_mla, paged: and one multiply by its tile's scale per latent value).
  static int64_t dequant_ops(int nb) {
    return (int64_t)nb * (KVF == KV_DS_MLA || PAGED ? 2 * LAT + ROPE : D);
  }

  // One stored token -> its D values as the cube reads them (exact: an e4m3 value, times a
  // power of two for fp8_ds_mla and paged, is a bf16 value).  fp8_e4m3's descale is not applied here
  // (compute folds it into the scores, finalize into the output) but for the planted fault.
  void decode(const uint8_t* row, float* out, float ds) const {
    if (KVF == KV_PLAIN) {
      to_f32<T>((const uint16_t*)row, out, D);
      return;
    }
    const float* e4m3 = e4m3_table();
    if (KVF == KV_E4M3) {
      const float twice = Cfg::FAULT == FAULT_KV_SCALE_TWICE ? ds : 1.0f;
      for (int d = 0; d < D; ++d) out[d] = e4m3[row[d]] * twice;
      return;
    }
    if (PAGED) {   // the packed token: data row, then its UE8M0 scale bytes
      const uint8_t* ue8m0 = row + ROW_B;
      for (int g = 0; g < LAT / kPagedTile; ++g) {
        const int e = ue8m0[g];
        const float s = e == 255 ? std::numeric_limits<float>::quiet_NaN() : std::ldexp(1.0f, e - 127);
        for (int d = g * kPagedTile; d < (g + 1) * kPagedTile; ++d) out[d] = e4m3[row[d]] * s;
      }
      for (int i = 0; i < ROPE; ++i) out[LAT + i] = Bf16::to_f32(u16_at(row + LAT + 2 * i));
      return;
    }
    constexpr int TILES = LAT / kDsTile;
    for (int t = 0; t < TILES; ++t) {
      const int from = Cfg::FAULT == FAULT_KV_SCALE_WRONG_TILE ? (t + 1) % TILES : t;
      float s = f32_at(row + LAT + 4 * from);
      if (Cfg::FAULT == FAULT_KV_SCALE_TWICE) s *= s;
      for (int d = t * kDsTile; d < (t + 1) * kDsTile; ++d) out[d] = e4m3[row[d]] * s;
    }
    const uint8_t* rope = row + LAT + 4 * TILES;   // bf16, not quantized
    for (int i = 0; i < ROPE; ++i) out[LAT + i] = Bf16::to_f32(u16_at(rope + 2 * i));
  }

  void block(Core& c, const uint8_t* kv, int nb, int64_t j0, int rows, const int64_t* lim,
             float scl, float ds, Scratch& sc) {
    float* kt = sc.kt.data();
    float* v = sc.v.data();
    float* vals = sc.row.data();
    for (int j = 0; j < nb; ++j) {
      decode(kv + (int64_t)j * KVB, vals, ds);
      for (int d = 0; d < D; ++d) kt[(int64_t)d * BKV + j] = vals[d];
      std::copy(vals, vals + DV, v + (int64_t)j * DV);
    }
    float* S = scores(c);
    gemm(rows, nb, D, sc.qf.data(), D, kt, BKV, S, BKV, false);
    float* O = acc(c);
    float* M = mx(c);
    float* L = sm(c);
    for (int r = 0; r < rows; ++r) {
      float* s = S + (int64_t)r * BKV;
      float m = M[r];
      bool nan = false;
      for (int j = 0; j < nb; ++j) {
        s[j] = (j0 + j <= lim[r]) ? s[j] * scl : kNegInf;
        nan |= s[j] != s[j];
        m = std::max(m, s[j]);  // skips a NaN score: the exp below carries it into L
      }
      // nothing visible yet in this row (a -inf score weighs nothing); a NaN score (NaN in
      // q or a seen cache slot, or inf - inf) must not pass for that: it propagates
      if (m == kNegInf && !nan) {
        for (int j = 0; j < nb; ++j) s[j] = 0.f;
        continue;
      }
      const float corr = std::exp(M[r] - m);  // exp(-inf) = 0 on the first visible block
      float sum = 0.f;
      for (int j = 0; j < nb; ++j) {
        s[j] = std::exp(s[j] - m);
        sum += s[j];
      }
      L[r] = L[r] * corr + sum;
      M[r] = m;
      if (corr != 1.f) {
        float* o = O + (int64_t)r * DV;
        for (int d = 0; d < DV; ++d) o[d] *= corr;
      }
    }
    gemm(rows, DV, nb, S, BKV, v, DV, O, DV, true);
  }

  // BDC normalises into the out slot; returns the slot's step for the store (phase_b issues
  // it after the next tile load).  A final row with nothing visible gets lse +inf (FlashMLA's
  // convention); a partial keeps -inf for the merge.
  int64_t finalize(Core& c, Bufs& B, const Piece& pc) {
    const int nh = pc.h1 - pc.h0, rows = nh * (int)sq();
    const int64_t o = B.outs++;
    Slot& s = B.out[o];
    const int64_t dep = c.begin_fill(s, o);
    const bool partial = pc.part >= 0;
    float* dst = (float*)c.wr(c.lmem, LMEM, s.off, s.bytes);   // partial: fp32 O then lse
    if (!dry_) {
      float* O = acc(c);
      float* M = mx(c);
      float* L = sm(c);
      uint16_t* dst16 = (uint16_t*)dst;        // final: 16-bit O then fp32 lse
      float* lse = dst + (int64_t)rows * DV;
      const float ds = descale(c, pc.seq);   // fp8_e4m3: P (V_stored ds) = ds (P V_stored)
      for (int r = 0; r < rows; ++r) {
        const bool empty = L[r] == 0.f;
        float inv = empty ? 0.f : ds / L[r];
        const float* src = O + (int64_t)r * DV;
        lse[r] = !empty ? M[r] + std::log(L[r])
                        : partial ? kNegInf : std::numeric_limits<float>::infinity();
        if (SINKS && !partial) {   // a whole row: its sink now (a split one's after the merge)
          const int h = pc.h0 + r % nh;
          inv *= sink_factor(c, h, lse[r]);
          lse[r] = sink_lse(c, h, lse[r]);
        }
        if (partial)
          for (int d = 0; d < DV; ++d) dst[(int64_t)r * DV + d] = src[d] * inv;
        else
          for (int d = 0; d < DV; ++d) dst16[(int64_t)r * DV + d] = T::from_f32(src[d] * inv);
      }
    }
    const int64_t ev = c.emit(BDC, OP_VECTOR, LMEM, LMEM, 0, 0, 0, 0, (int64_t)rows * DV, s.index, {dep});
    c.end_fill(s, o, ev);
    return o;
  }

  // GDMA: an out slot to its destination.  part >= 0: the partial's place in L2; else the
  // output (DDR, or o_lat in L2 when fused) and lse (DDR).
  void store(Core& c, Slot& s, int64_t o, int seq, int h0, int h1, int part) {
    const int64_t ready = c.wait(s, o);
    c.check_read(s, o);
    const int nh = h1 - h0, rows = nh * (int)sq();
    int64_t ev;
    if (part >= 0) {
      Core::Copy cp(c);
      cp(chip_.l2.at(part_l2_ + part * part_bytes()), c.rd(c.lmem, LMEM, s.off, part_bytes()),
         part_bytes());
      ev = c.dma(GDMA, LMEM, L2, cp, {ready});
    } else {
      const uint16_t* src = (const uint16_t*)c.rd(c.lmem, LMEM, s.off, s.bytes);
      const float* lse = (const float*)src + (int64_t)rows * DV;
      uint16_t* dst = Cfg::FUSED ? (uint16_t*)chip_.l2.at(o_l2_) : a_.out;
      Core::Copy co(c), cl(c);
      for (int q = 0; q < sq(); ++q)
        co(dst + (((int64_t)seq * sq() + q) * H + h0) * DV, src + (int64_t)q * nh * DV,
           (int64_t)nh * DV * EL);
      for (int r = 0; r < rows; ++r) {
        const int q = r / nh, h = h0 + r % nh;
        cl(a_.lse + lse_at(seq, q, h), lse + r, 4);
      }
      c.dma(GDMA, LMEM, Cfg::FUSED ? L2 : DDR, co, {ready});
      ev = c.dma(GDMA, LMEM, DDR, cl, {});
    }
    c.release(s, o, ev);
  }

  // ------------------------------------------------------------------ merge ------------
  void merge(Core& c) {
    Bufs& B = bufs_[c.id];
    c.lmem.reset();
    c.rings.resize(1);
    c.make_ring(B.mrg, "LMEM merge slot", 2, part_bytes());
    c.make_ring(B.out, "LMEM out slot", 1, part_bytes());
    B.work = c.lmem.alloc((int64_t)rows_ * (DV + 2) * 4, "the merge accumulator");
    if (SINKS) sink_off_[c.id] = c.lmem.alloc((int64_t)H * 4, "the sinks");
    c.lmem.commit();
    int64_t sink_ev = plan_.merge_per_core[c.id].empty() ? kNone : load_sinks(c);
    for (int seq : plan_.merge_per_core[c.id]) {
      const auto& parts = plan_.parts_of_seq[seq];
      const int64_t base = B.mrgs;
      auto load = [&](size_t i) {
        Slot& s = B.mrg[base + i];
        const int64_t dep = c.begin_fill(s, base + i);
        Core::Copy cp(c);
        cp(c.wr(c.lmem, LMEM, s.off, part_bytes()),
           chip_.l2.at(part_l2_ + parts[i] * part_bytes()), part_bytes());
        const int64_t ev = c.dma(GDMA, L2, LMEM, cp, {dep});
        c.end_fill(s, base + i, ev);
      };
      float* O = (float*)c.lmem.at(B.work);
      float* Lse = O + (int64_t)rows_ * DV;
      if (!dry_) {
        std::fill(O, O + (int64_t)rows_ * DV, 0.f);
        std::fill(Lse, Lse + rows_, kNegInf);
      }
      load(0);
      for (size_t i = 0; i < parts.size(); ++i) {
        if (i + 1 < parts.size()) load(i + 1);
        Slot& s = B.mrg[base + i];
        const int64_t w = c.wait(s, base + i);
        c.check_read(s, base + i);
        const float* part = (const float*)c.rd(c.lmem, LMEM, s.off, part_bytes());
        if (!dry_) merge_one(part, O, Lse, (int)parts.size());
        const int64_t ev = c.emit(BDC, OP_VECTOR, LMEM, LMEM, 0, 0, 0, 0, (int64_t)rows_ * DV * 2, s.index, {w});
        c.release(s, base + i, ev);
      }
      B.mrgs += parts.size();
      // write the merged result like an unsplit piece: O normalised, lse in the slot
      const int64_t o = B.outs++;
      Slot& s = B.out[o];
      const int64_t dep = c.begin_fill(s, o);
      uint16_t* dst16 = (uint16_t*)c.wr(c.lmem, LMEM, s.off, s.bytes);
      if (!dry_) {
        float* lse = (float*)dst16 + (int64_t)rows_ * DV;
        for (int r = 0; r < rows_; ++r) {
          lse[r] = Lse[r] == kNegInf ? std::numeric_limits<float>::infinity() : Lse[r];
          if (SINKS) {   // the row's sink, on the merged output
            const int h = r % H;
            const float f = sink_factor(c, h, lse[r]);
            for (int d = 0; d < DV; ++d) O[(int64_t)r * DV + d] *= f;
            lse[r] = sink_lse(c, h, lse[r]);
          }
        }
        from_f32<T>(O, dst16, (int64_t)rows_ * DV);
      }
      c.end_fill(s, o, c.emit(BDC, OP_VECTOR, LMEM, LMEM, 0, 0, 0, 0, (int64_t)rows_ * DV, s.index, {dep, sink_ev}));
      sink_ev = kNone;
      store(c, s, o, seq, 0, H, -1);
    }
  }

  // Fold one partial (normalised O, lse per row) into the running (O, lse).
  void merge_one(const float* part, float* O, float* Lse, int nparts) {
    const float* lse_p = part + (int64_t)rows_ * DV;
    for (int r = 0; r < rows_; ++r) {
      // planted: an empty partial's lse read as 0 (as if it had weight)
      const float lp = Cfg::FAULT == FAULT_EMPTY_PARTIAL_UNMASKED && lse_p[r] == kNegInf ? 0.f : lse_p[r];
      if (lp == kNegInf) continue;  // nothing visible in this slice for this row
      float* o = O + (int64_t)r * DV;
      const float* p = part + (int64_t)r * DV;
      if (Cfg::FAULT == FAULT_BAD_SPLIT_MERGE) {  // planted: no lse weights
        for (int d = 0; d < DV; ++d) o[d] += p[d] / nparts;
        Lse[r] = Lse[r] == kNegInf ? lp : std::max(Lse[r], lp) + std::log1p(std::exp(-std::fabs(Lse[r] - lp)));
        continue;
      }
      const float L = Lse[r];
      const float nl = L == kNegInf ? lp : std::max(L, lp) + std::log1p(std::exp(-std::fabs(L - lp)));
      const float wo = L == kNegInf ? 0.f : std::exp(L - nl), wp = std::exp(lp - nl);
      for (int d = 0; d < DV; ++d) o[d] = o[d] * wo + p[d] * wp;
      Lse[r] = nl;
    }
  }

  // ------------------------------------------------------------------ phases A and C ---
  void lay_out_proj(Core& c, int64_t in_cols, int64_t w_bytes, int64_t out_cols, int64_t work_cols) {
    Bufs& B = bufs_[c.id];
    c.lmem.reset();
    c.rings.resize(1);
    c.make_ring(B.w, "LMEM weight slot", 2, w_bytes);
    c.make_ring(B.pin, "LMEM projection input slot", 2, (int64_t)PR * in_cols * EL);
    c.make_ring(B.pout, "LMEM projection output slot", 2, (int64_t)PR * out_cols * EL);
    B.pwork = c.lmem.alloc((int64_t)PR * work_cols * 4, "the projection work buffer");
    c.lmem.commit();
  }

  struct Item {
    int64_t r0, r1;  // token rows (b * s_q + s) of the chunk
    int h;
    bool chunk_first, chunk_last;
  };
  std::vector<Item> proj_items(int core) const {
    std::vector<Item> items;
    const int h0 = core * HPC;
    const int span = Cfg::FAULT == FAULT_DEFAULT_HEAD_SPLIT ? (H + CORES - 1) / CORES : HPC;
    const int h1 = std::min(H, h0 + span);
    const int64_t tokens = a_.batch * a_.s_q;
    const int64_t upto = Cfg::FAULT == FAULT_PROJ_FIRST_CHUNK_ONLY ? std::min<int64_t>(tokens, PR) : tokens;
    for (int64_t r0 = 0; r0 < upto; r0 += PR)
      for (int h = h0; h < h1; ++h)
        items.push_back({r0, std::min(tokens, r0 + PR), h, h == h0, h == h1 - 1});
    return items;
  }

  // Phase A: q = q_lora W_UQ; q_lat = q_nope W_UK; RoPE(q_pe); [q_lat | q_pe] -> L2.
  void phase_a(Core& c) {
    Bufs& B = bufs_[c.id];
    lay_out_proj(c, R, (int64_t)(R * (NOPE + ROPE) + NOPE * DV) * EL, D, NOPE + ROPE + DV);
    const auto items = proj_items(c.id);
    std::vector<float> x, wq, wk;
    if (!dry_) {
      x.resize((size_t)PR * R);
      wq.resize((size_t)R * (NOPE + ROPE));
      wk.resize((size_t)NOPE * DV);
    }
    int64_t chunk = 0;  // step counter of the input ring
    auto fill_in = [&](const Item& it, int64_t step) {
      Slot& s = B.pin[step];
      const int64_t dep = c.begin_fill(s, step);
      Core::Copy cp(c);
      cp(c.wr(c.lmem, LMEM, s.off, (it.r1 - it.r0) * R * EL), a_.q_lora + it.r0 * R,
         (it.r1 - it.r0) * R * EL);
      const int64_t ev = c.dma(GDMA, DDR, LMEM, cp, {dep});
      c.end_fill(s, step, ev);
    };
    auto fill_w = [&](const Item& it, int64_t step) {
      Slot& s = B.w[step];
      const int64_t dep = c.begin_fill(s, step);
      uint16_t* dst = (uint16_t*)c.wr(c.lmem, LMEM, s.off, s.bytes);
      Core::Copy cq(c), ck(c);
      for (int r = 0; r < R; ++r)  // the head's columns of every row of W_UQ
        cq(dst + (int64_t)r * (NOPE + ROPE), a_.w_uq + ((int64_t)r * H + it.h) * (NOPE + ROPE),
           (NOPE + ROPE) * EL);
      ck(dst + (int64_t)R * (NOPE + ROPE), a_.w_uk + (int64_t)it.h * NOPE * DV,
         (int64_t)NOPE * DV * EL);
      c.dma(GDMA, DDR, LMEM, cq, {dep}, PH_SETUP);
      const int64_t ev = c.dma(GDMA, DDR, LMEM, ck, {}, PH_SETUP);
      c.end_fill(s, step, ev);
    };
    if (items.empty()) return;
    fill_in(items[0], 0);
    fill_w(items[0], 0);
    for (size_t i = 0; i < items.size(); ++i) {
      const Item& it = items[i];
      if (i + 1 < items.size()) {
        if (items[i + 1].chunk_first) fill_in(items[i + 1], chunk + 1);
        fill_w(items[i + 1], (int64_t)i + 1);
      }
      const int nr = (int)(it.r1 - it.r0);
      Slot& ws = B.w[i];
      Slot& xs = B.pin[chunk];
      const int64_t w1 = c.wait(ws, (int64_t)i);
      const int64_t w2 = it.chunk_first ? c.wait(xs, chunk) : kNone;
      c.check_read(ws, (int64_t)i);
      c.check_read(xs, chunk);
      const int64_t o = B.outs++;
      Slot& os = B.pout[o];
      const int64_t dep_o = c.begin_fill(os, o);
      const uint16_t* xin = (const uint16_t*)c.rd(c.lmem, LMEM, xs.off, (int64_t)nr * R * EL);
      const uint16_t* w = (const uint16_t*)c.rd(c.lmem, LMEM, ws.off, ws.bytes);
      uint16_t* dst = (uint16_t*)c.wr(c.lmem, LMEM, os.off, (int64_t)nr * D * EL);  // absorbed q rows
      if (!dry_) {
        if (it.chunk_first) to_f32<T>(xin, x.data(), (int64_t)nr * R);
        to_f32<T>(w, wq.data(), (int64_t)R * (NOPE + ROPE));
        to_f32<T>(w + (int64_t)R * (NOPE + ROPE), wk.data(), (int64_t)NOPE * DV);
        float* qh = (float*)c.lmem.at(B.pwork);           // [nr, nope + rope]
        float* ql = qh + (int64_t)PR * (NOPE + ROPE);     // [nr, dv]
        gemm(nr, NOPE + ROPE, R, x.data(), R, wq.data(), NOPE + ROPE, qh, NOPE + ROPE, false);
        gemm(nr, DV, NOPE, qh, NOPE + ROPE, wk.data(), DV, ql, DV, false);
        for (int r = 0; r < nr; ++r) {
          from_f32<T>(ql + (int64_t)r * DV, dst + (int64_t)r * D, DV);
          const int64_t tok = it.r0 + r, b = tok / a_.s_q, s = tok % a_.s_q;
          // a row at a negative position (a sequence shorter than s_q; without causal it
          // sees keys) turns by the negative angle: cos(-a) = cos(a), sin(-a) = -sin(a),
          // from the table's row -pos (checked above when such a row sees a key)
          const int64_t pos = a_.seqlens[b] - a_.s_q + s, row = pos < 0 ? -pos : pos;
          const float sgn = pos < 0 ? -1.0f : 1.0f;
          const float* co_row = row < a_.rope_rows ? a_.rope_cos + row * (ROPE / 2) : nullptr;
          const float* si_row = row < a_.rope_rows ? a_.rope_sin + row * (ROPE / 2) : nullptr;
          const float* pe = qh + (int64_t)r * (NOPE + ROPE) + NOPE;
          uint16_t* qpe = dst + (int64_t)r * D + DV;
          // frequency i rotates (x[2i], x[2i+1]) interleaved, or (x[i], x[i + ROPE/2]) half
          const int stride = a_.rope_layout == 0 ? 1 : ROPE / 2, step = a_.rope_layout == 0 ? 2 : 1;
          for (int i2 = 0; i2 < ROPE / 2; ++i2) {
            const float co = co_row ? co_row[i2] : 1.0f, si = si_row ? sgn * si_row[i2] : 0.0f;
            const int j0 = step * i2, j1 = j0 + stride;
            const float x0 = pe[j0], x1 = pe[j1];
            qpe[j0] = T::from_f32(x0 * co - x1 * si);
            qpe[j1] = T::from_f32(x0 * si + x1 * co);
          }
        }
      }
      c.emit(BDC, OP_MATMUL, LMEM, LMEM, 0, nr, NOPE + ROPE, R, 0, ws.index, {w1, w2, dep_o});
      // q_nope stays fp32 into W_UK (the oracle does not round it): elems = 4 tells the cost
      // model to charge the cube's fp32 rate for this product
      c.emit(BDC, OP_MATMUL, LMEM, LMEM, 0, nr, DV, NOPE, 4, ws.index, {});
      const int64_t ev = c.emit(BDC, OP_VECTOR, LMEM, LMEM, 0, 0, 0, 0, (int64_t)nr * D, os.index, {});
      c.release(ws, (int64_t)i, ev);
      if (it.chunk_last) c.release(xs, chunk, ev);
      c.end_fill(os, o, ev);
      // GDMA: the head's absorbed q rows to L2 [b, s_q, h, d]
      const int64_t ready = c.wait(os, o);
      c.check_read(os, o);
      const uint16_t* qrows = (const uint16_t*)c.rd(c.lmem, LMEM, os.off, (int64_t)nr * D * EL);
      Core::Copy cp(c);
      for (int r = 0; r < nr; ++r)
        cp(chip_.l2.at(q_l2_ + ((it.r0 + r) * H + it.h) * D * EL), qrows + (int64_t)r * D, D * EL);
      const int64_t st = c.dma(GDMA, LMEM, L2, cp, {ready});
      c.release(os, o, st);
      if (it.chunk_last) ++chunk;
    }
  }

  // Phase C: out[b, s, h] = o_lat[b, s, h] W_UV[h].
  void phase_c(Core& c) {
    Bufs& B = bufs_[c.id];
    lay_out_proj(c, DV, (int64_t)DV * VH * EL, VH, VH);
    const auto items = proj_items(c.id);
    std::vector<float> x, w;
    if (!dry_) {
      x.resize((size_t)PR * DV);
      w.resize((size_t)DV * VH);
    }
    // one input slot per item: the head's latent rows (strided in L2)
    auto fill = [&](const Item& it, int64_t step) {
      Slot& s = B.pin[step];
      const int64_t dep = c.begin_fill(s, step);
      const int nr = (int)(it.r1 - it.r0);
      uint16_t* dst = (uint16_t*)c.wr(c.lmem, LMEM, s.off, (int64_t)nr * DV * EL);
      Core::Copy cp(c);
      for (int r = 0; r < nr; ++r)
        cp(dst + (int64_t)r * DV, chip_.l2.at(o_l2_ + ((it.r0 + r) * H + it.h) * DV * EL), DV * EL);
      const int64_t ev = c.dma(GDMA, L2, LMEM, cp, {dep});
      c.end_fill(s, step, ev);
      Slot& ws = B.w[step];
      const int64_t dw = c.begin_fill(ws, step);
      Core::Copy cw(c);
      cw(c.wr(c.lmem, LMEM, ws.off, (int64_t)DV * VH * EL), a_.w_uv + (int64_t)it.h * DV * VH,
         (int64_t)DV * VH * EL);
      const int64_t ew = c.dma(GDMA, DDR, LMEM, cw, {dw}, PH_SETUP);
      c.end_fill(ws, step, ew);
    };
    if (items.empty()) return;
    fill(items[0], 0);
    for (size_t i = 0; i < items.size(); ++i) {
      const Item& it = items[i];
      const int64_t step = (int64_t)i;
      if (i + 1 < items.size()) fill(items[i + 1], step + 1);
      const int nr = (int)(it.r1 - it.r0);
      Slot& xs = B.pin[step];
      Slot& ws = B.w[step];
      const int64_t w1 = c.wait(xs, step), w2 = c.wait(ws, step);
      c.check_read(xs, step);
      c.check_read(ws, step);
      const int64_t o = B.outs++;
      Slot& os = B.pout[o];
      const int64_t dep_o = c.begin_fill(os, o);
      const uint16_t* xin = (const uint16_t*)c.rd(c.lmem, LMEM, xs.off, (int64_t)nr * DV * EL);
      const uint16_t* win = (const uint16_t*)c.rd(c.lmem, LMEM, ws.off, (int64_t)DV * VH * EL);
      uint16_t* yout = (uint16_t*)c.wr(c.lmem, LMEM, os.off, (int64_t)nr * VH * EL);
      if (!dry_) {
        to_f32<T>(xin, x.data(), (int64_t)nr * DV);
        to_f32<T>(win, w.data(), (int64_t)DV * VH);
        float* y = (float*)c.lmem.at(B.pwork);
        gemm(nr, VH, DV, x.data(), DV, w.data(), VH, y, VH, false);
        from_f32<T>(y, yout, (int64_t)nr * VH);
      }
      c.emit(BDC, OP_MATMUL, LMEM, LMEM, 0, nr, VH, DV, 0, ws.index, {w1, w2, dep_o});
      const int64_t ev = c.emit(BDC, OP_VECTOR, LMEM, LMEM, 0, 0, 0, 0, (int64_t)nr * VH, os.index, {});
      c.release(xs, step, ev);
      c.release(ws, step, ev);
      c.end_fill(os, o, ev);
      const int64_t ready = c.wait(os, o);
      c.check_read(os, o);
      const uint16_t* yrows = (const uint16_t*)c.rd(c.lmem, LMEM, os.off, (int64_t)nr * VH * EL);
      Core::Copy cp(c);
      for (int r = 0; r < nr; ++r)
        cp(a_.out + ((it.r0 + r) * H + it.h) * VH, yrows + (int64_t)r * VH, VH * EL);
      const int64_t st = c.dma(GDMA, LMEM, DDR, cp, {ready});
      c.release(os, o, st);
    }
  }
};

// The C entry point's body, shared by every variant.
template <class Cfg>
int run_entry(const Sc11Args* args, int dry, Sc11Result* res, char* err, int errlen) {
  auto put = [&](const char* m) {
    if (err && errlen > 0) {
      std::strncpy(err, m, errlen - 1);
      err[errlen - 1] = 0;
    }
  };
  if (!args || !res) {
    put("null argument");
    return 2;
  }
  *res = Sc11Result{};
  try {
    Mla<Cfg> k(*args, dry != 0);
    k.run(res);
    return 0;
  } catch (const ArgError& e) {
    put(e.what());
    return 2;
  } catch (const std::bad_alloc&) {
    put("host memory exhausted while emulating");
    return 1;
  } catch (const std::exception& e) {
    put(e.what());
    return 1;
  }
}

}  // namespace sc11
