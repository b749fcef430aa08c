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
};

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

  // Per-core buffers (LMEM rings are re-laid out at each phase; L2 rings live throughout).
  struct Bufs {
    Ring l2kv;                 // phase B: SDMA-gathered KV tiles in L2
    Ring q, kv, out, mrg;      // phase B / merge, LMEM
    Ring w, pin, pout;         // phases A and C, LMEM
    int64_t work = 0, pwork = 0;
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
    rows_ = (int)a_.s_q * H;
    kv_len_.resize(a_.batch);
    for (int64_t b = 0; b < a_.batch; ++b) kv_len_[b] = keys_read(a_.seqlens[b]);
    plan_ = make_plan((int)a_.scheme, kv_len_, H, CORES, HPC, BKV);

    // L2: every core's KV slots (static, the schedule check counts these) ...
    for (int c = 0; c < CORES; ++c) {
      Bufs& B = bufs_[c];
      B.l2kv.slots.assign(NBUF, Slot{});
      for (int i = 0; i < NBUF; ++i) {
        B.l2kv.slots[i].name = "L2 kv slot";
        B.l2kv.slots[i].index = i;
        B.l2kv.slots[i].mem = L2;
        B.l2kv.slots[i].bytes = TILE * D * EL;
        B.l2kv.slots[i].off = chip_.l2.alloc(TILE * D * EL, "a KV tile slot");
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

  int64_t part_bytes() const { return (int64_t)rows_ * (DV + 1) * 4; }

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
    if (!a_.k_cache || !a_.block_table || !a_.seqlens || (!dry_ && (!a_.out || !a_.lse)))
      arg_fail("a required pointer is null (%lld)", 0);
    if (Cfg::FUSED ? (!a_.q_lora || !a_.w_uq || !a_.w_uk || !a_.w_uv) : !a_.q)
      arg_fail("a required input pointer is null (%lld)", 0);
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
    c.make_ring(B.kv, "LMEM kv slot", NBUF, TILE * D * EL);
    // one output slot: its store overlaps the next piece's compute, which refills it only
    // when that piece ends
    c.make_ring(B.out, "LMEM out slot", 1, (int64_t)rows_ * (DV + 1) * 4);
    // scores of one block, the O accumulator, running max and sum
    B.work = c.lmem.alloc((int64_t)rows_ * (BKV + DV + 2) * 4, "the attention work buffer");
    c.lmem.commit();
  }

  // ------------------------------------------------------------------ phase B ----------
  struct Step {
    int piece;
    int64_t t0, t1;
    bool first, last;
  };

  void phase_b(Core& c) {
    lay_out_b(c);
    Bufs& B = bufs_[c.id];
    const auto& pieces = plan_.per_core[c.id];
    std::vector<Step> steps;
    for (int p = 0; p < (int)pieces.size(); ++p) {
      const Piece& pc = pieces[p];
      if (pc.t1 <= pc.t0) {
        steps.push_back({p, pc.t0, pc.t0, true, true});
        continue;
      }
      for (int64_t t = pc.t0; t < pc.t1; t += TILE)
        steps.push_back({p, t, std::min(pc.t1, t + TILE), t == pc.t0, t + TILE >= pc.t1});
    }
    // KV steps (those with keys) are numbered k = 0..nk-1; slot of step k is k % NBUF
    std::vector<int64_t> kstep(steps.size(), -1);
    int64_t nk = 0;
    for (size_t i = 0; i < steps.size(); ++i)
      if (steps[i].t1 > steps[i].t0) kstep[i] = nk++;
    std::vector<size_t> step_of_k;
    for (size_t i = 0; i < steps.size(); ++i)
      if (kstep[i] >= 0) step_of_k.push_back(i);

    Scratch sc;
    sc.init(rows_);
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
      if (st.first) init_acc(c, pc);
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

  // SDMA: the pages holding keys [t0, t1) of one sequence, DDR -> contiguous L2 slot.
  void sdma_gather(Core& c, Bufs& B, const Piece& pc, const Step& st, int64_t step) {
    Slot& s = B.l2kv[step];
    const int64_t dep = c.begin_fill(s, step);
    const int64_t n = st.t1 - st.t0;
    uint16_t* dst = (uint16_t*)c.wr(chip_.l2, L2, s.off, n * D * EL);
    Core::Copy cp(c);
    for (int64_t t = st.t0; t < st.t1;) {
      const int64_t page = t / PAGE, len0 = std::min<int64_t>(PAGE - t % PAGE, st.t1 - t);
      const int64_t in = Cfg::FAULT == FAULT_PAGE_START_ASSUMED ? 0 : t % PAGE;
      const int64_t len = Cfg::FAULT == FAULT_PAGE_START_ASSUMED ? len0 : std::min<int64_t>(PAGE - in, st.t1 - t);
      const int64_t blk = a_.block_table[pc.seq * a_.max_blocks + page];
      cp(dst + (t - st.t0) * D, a_.k_cache + (blk * PAGE + in) * D, len * D * EL);
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
    const int64_t n = st.t1 - st.t0;
    const int64_t dep_kv = c.begin_fill(kv, step);
    Core::Copy ckv(c);
    ckv(c.wr(c.lmem, LMEM, kv.off, n * D * EL), c.rd(chip_.l2, L2, l2.off, n * D * EL), n * D * EL);
    const int64_t ev_kv = c.dma(GDMA, L2, LMEM, ckv, {ready, dep_kv});
    c.end_fill(kv, step, ev_kv);
    const int64_t dep_q = c.begin_fill(q, step);
    const int nh = pc.h1 - pc.h0;
    uint16_t* dst = (uint16_t*)c.wr(c.lmem, LMEM, q.off, (int64_t)a_.s_q * nh * D * EL);
    const uint16_t* src = Cfg::FUSED ? (const uint16_t*)c.rd(chip_.l2, L2, q_l2_, 0) : a_.q;
    Core::Copy cq(c);
    for (int s = 0; s < a_.s_q; ++s)
      cq(dst + (int64_t)s * nh * D, src + (((int64_t)pc.seq * a_.s_q + s) * H + pc.h0) * D,
         (int64_t)nh * D * EL);
    const int64_t ev_q = c.dma(GDMA, Cfg::FUSED ? L2 : DDR, LMEM, cq, {dep_q});
    c.end_fill(q, step, ev_q);
  }

  // Host-side fp32 copies the emulated BDC computes on (it reads 16-bit LMEM data with
  // fp32 accumulation; these conversions are the emulator's, not the card's, so they are
  // not counted in LMEM).
  struct Scratch {
    std::vector<float> qf, kt, v;
    void init(int rows) {
      qf.assign((size_t)rows * D, 0.f);
      kt.assign((size_t)D * BKV, 0.f);
      v.assign((size_t)BKV * DV, 0.f);
    }
  };

  float* scores(Core& c) { return (float*)c.lmem.at(bufs_[c.id].work); }
  float* acc(Core& c) { return scores(c) + (int64_t)rows_ * BKV; }
  float* mx(Core& c) { return acc(c) + (int64_t)rows_ * DV; }
  float* sm(Core& c) { return mx(c) + rows_; }

  void init_acc(Core& c, const Piece& pc) {
    const int rows = (pc.h1 - pc.h0) * (int)a_.s_q;
    if (!dry_) {
      std::fill(acc(c), acc(c) + (int64_t)rows * DV, 0.f);
      std::fill(mx(c), mx(c) + rows, kNegInf);
      std::fill(sm(c), sm(c) + rows, 0.f);
    }
    c.emit(BDC, OP_VECTOR, LMEM, LMEM, 0, 0, 0, 0, (int64_t)rows * (DV + 2), -1, {});
  }

  // BDC: online softmax over blocks of BKV keys of the tile in the LMEM slot.
  void compute(Core& c, Bufs& B, const Piece& pc, const Step& st, int64_t step, Scratch& sc) {
    const int nh = pc.h1 - pc.h0, rows = nh * (int)a_.s_q;
    const int64_t w_kv = c.wait(B.kv[step], step);
    const int64_t w_q = c.wait(B.q[step], step);
    // the planted early_buffer_swap reads the slot of the next step (the address check in
    // Core::rd sees a slot that is free or being filled)
    const int64_t rs = Cfg::FAULT == FAULT_EARLY_BUFFER_SWAP ? step + 1 : step;
    const int64_t n = st.t1 - st.t0;
    const uint16_t* kv = (const uint16_t*)c.rd(c.lmem, LMEM, B.kv[rs].off, n * D * EL);
    c.check_read(B.kv[step], step);
    c.check_read(B.q[step], step);
    const uint16_t* q = (const uint16_t*)c.rd(c.lmem, LMEM, B.q[step].off, (int64_t)rows * D * EL);
    if (!dry_) to_f32<T>(q, sc.qf.data(), (int64_t)rows * D);
    const float scl = scale();
    std::vector<int64_t> lim(rows);
    for (int r = 0; r < rows; ++r) lim[r] = visible_limit(pc.seq, r / nh);
    int64_t last = kNone;
    bool first = true;
    for (int64_t j0 = st.t0; j0 < st.t1; j0 += BKV) {
      const int nb = (int)std::min<int64_t>(BKV, st.t1 - j0);
      if (!dry_) block(c, kv + (j0 - st.t0) * D, nb, j0, rows, lim.data(), scl, sc);
      std::initializer_list<int64_t> deps = {w_kv, w_q};
      c.emit(BDC, OP_MATMUL, LMEM, LMEM, 0, rows, nb, D, 0, B.kv[step].index,
             first ? deps : std::initializer_list<int64_t>{});
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

  void block(Core& c, const uint16_t* kv, int nb, int64_t j0, int rows, const int64_t* lim,
             float scl, Scratch& sc) {
    float* kt = sc.kt.data();
    float* v = sc.v.data();
    for (int j = 0; j < nb; ++j) {
      const uint16_t* row = kv + (int64_t)j * D;
      for (int d = 0; d < D; ++d) kt[(int64_t)d * BKV + j] = T::to_f32(row[d]);
      to_f32<T>(row, v + (int64_t)j * DV, DV);
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
    const int nh = pc.h1 - pc.h0, rows = nh * (int)a_.s_q;
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
      for (int r = 0; r < rows; ++r) {
        const bool empty = L[r] == 0.f;
        const float inv = empty ? 0.f : 1.f / L[r];
        const float* src = O + (int64_t)r * DV;
        if (partial)
          for (int d = 0; d < DV; ++d) dst[(int64_t)r * DV + d] = src[d] * inv;
        else
          for (int d = 0; d < DV; ++d) dst16[(int64_t)r * DV + d] = T::from_f32(src[d] * inv);
        lse[r] = !empty ? M[r] + std::log(L[r])
                        : partial ? kNegInf : std::numeric_limits<float>::infinity();
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
    const int nh = h1 - h0, rows = nh * (int)a_.s_q;
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
      for (int q = 0; q < a_.s_q; ++q)
        co(dst + (((int64_t)seq * a_.s_q + q) * H + h0) * DV, src + (int64_t)q * nh * DV,
           (int64_t)nh * DV * EL);
      for (int r = 0; r < rows; ++r) {
        const int q = r / nh, h = h0 + r % nh;
        cl(a_.lse + ((int64_t)seq * H + h) * a_.s_q + q, lse + r, 4);
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
    c.lmem.commit();
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
        from_f32<T>(O, dst16, (int64_t)rows_ * DV);
        for (int r = 0; r < rows_; ++r)
          lse[r] = Lse[r] == kNegInf ? std::numeric_limits<float>::infinity() : Lse[r];
      }
      c.end_fill(s, o, c.emit(BDC, OP_VECTOR, LMEM, LMEM, 0, 0, 0, 0, (int64_t)rows_ * DV, s.index, {dep}));
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
