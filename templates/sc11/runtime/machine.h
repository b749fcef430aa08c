// The emulated SC11 chip: memory spaces with capacity checks, per-core engine queues that
// record a trace, the fill / wait / release protocol of multi-buffer slots, and barriers.
//
// Execution model: every operation really happens (copy or math) at the moment the kernel
// issues it, in program order; the trace records what the card would run and the
// dependencies it would need, so the cost model can overlap engines.  In dry mode the data
// work is skipped but the control flow, checks and trace are identical.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "trace.h"

namespace sc11 {

// A protocol violation or capacity overflow: reaches Python as mlagen.errors.EmulatorError.
struct EmuError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// Arguments the kernel cannot run on: reaches Python as mlagen.errors.InputError.
struct ArgError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <class... A>
[[noreturn]] inline void fail(const char* fmt, A... a) {
  char buf[512];
  std::snprintf(buf, sizeof buf, fmt, a...);
  throw EmuError(buf);
}

inline int64_t round_up(int64_t x, int64_t g) { return (x + g - 1) / g * g; }

// A capacity-checked memory space (one core's LMEM or one chip's L2).  Allocations are
// rounded up to `granule` (LMEM: a bank; L2: the DMA alignment); the backing store is real
// host memory in compute mode and absent in dry mode.
class Space {
 public:
  Space() = default;
  Space(const char* name, int64_t capacity, int64_t granule, bool dry)
      : name_(name), cap_(capacity), granule_(granule), dry_(dry) {}

  // Returns the offset of a new buffer; raises when the space is full.
  int64_t alloc(int64_t bytes, const char* what) {
    const int64_t size = round_up(std::max<int64_t>(bytes, 1), granule_);
    if (used_ + size > cap_)
      fail("%s capacity exceeded: allocating %s (%lld B, %lld B after rounding to %lld B) "
           "with %lld of %lld B in use",
           name_, what, (long long)bytes, (long long)size, (long long)granule_,
           (long long)used_, (long long)cap_);
    const int64_t off = used_;
    used_ += size;
    high_ = std::max(high_, used_);
    return off;
  }
  void reset() { used_ = 0; }
  void commit() {  // back the allocated bytes with host memory (compute mode)
    if (!dry_ && (int64_t)data_.size() < high_) data_.assign(high_, 0);
  }
  uint8_t* at(int64_t off) { return data_.data() + off; }
  int64_t high() const { return high_; }
  int64_t used() const { return used_; }

 private:
  const char* name_ = "";
  int64_t cap_ = 0, granule_ = 1, used_ = 0, high_ = 0;
  bool dry_ = true;
  std::vector<uint8_t> data_;
};

// Event handles: global ids (>= 0, from earlier phases) or ids local to one core's current
// phase (kLocal | index), rewritten to global ids when the phase ends.
constexpr int64_t kLocal = int64_t(1) << 62;
constexpr int64_t kNone = -1;

// A buffer slot of a multi-buffer.  Protocol:
//   fill   (a DMA, or BDC writing an output)  needs the slot FREE;   -> FILLING -> FILLED
//   wait   (the consumer engine)              needs FILLED;          -> READY
//   read   (every consumer access)            needs READY and the expected step
//   release(last consumer event)              needs READY;           -> FREE
// Any other order is a bug in the kernel and raises EmuError.  Accesses are checked by
// address too (Core::rd / Core::wr): every byte read must lie in a READY slot or outside
// every slot, every byte written in a slot being filled or outside every slot.  So a read
// of the slot the next step's DMA is filling raises even when the bookkeeping calls agree.
struct Slot {
  enum State { FREE, FILLING, FILLED, READY };
  const char* name = "slot";
  int index = 0;
  int mem = LMEM;           // the space it lives in (LMEM or L2)
  int64_t off = 0;          // offset in its space
  int64_t bytes = 0;        // its size
  State state = FREE;
  int64_t step = -1;        // which step's data it holds
  int64_t fill_ev = kNone;  // the event that filled it
  int64_t free_ev = kNone;  // the event after which it may be refilled
};

struct Ring {
  std::vector<Slot> slots;
  Slot& operator[](int64_t step) { return slots[step % (int64_t)slots.size()]; }
  int size() const { return (int)slots.size(); }
};

struct Core {
  int id = 0;
  bool dry = true;
  Space lmem;
  std::vector<Event> events;          // this phase's events, local ids
  int64_t last[3] = {kNone, kNone, kNone};  // last event per engine queue
  int64_t barrier_dep = kNone;        // the barrier every engine's next event waits for
  bool engine_after_barrier[3] = {false, false, false};
  int phase = PH_SETUP;
  std::vector<Ring*> rings;           // every ring of this core (for phase-end checks)
  int64_t copied = 0;                 // bytes the DMA copies really moved (compute mode)

  static const char* state_name(Slot::State st) {
    return st == Slot::FREE ? "free (nothing waited for)" : st == Slot::FILLING ? "being filled"
         : st == Slot::FILLED ? "being filled (its DMA not waited for)" : "ready";
  }
  // Address checks: the slots of this core overlapping [off, off + bytes) in `mem`.
  template <class F>
  void overlapping(int mem, int64_t off, int64_t bytes, F f) const {
    for (const Ring* r : rings)
      for (const Slot& s : r->slots)
        if (s.mem == mem && off < s.off + s.bytes && s.off < off + bytes) f(s);
  }
  // A read of [off, off + bytes) of `sp`: only READY slots (or memory outside every slot).
  const uint8_t* rd(Space& sp, int mem, int64_t off, int64_t bytes) {
    overlapping(mem, off, bytes, [&](const Slot& s) {
      if (s.state != Slot::READY)
        fail("core %d: read of %s[%d] (offset %lld, %lld B) while it is %s", id, s.name,
             s.index, (long long)off, (long long)bytes, state_name(s.state));
    });
    return dry ? nullptr : sp.at(off);
  }
  // A write of [off, off + bytes) of `sp`: only slots being filled (or outside every slot).
  uint8_t* wr(Space& sp, int mem, int64_t off, int64_t bytes) {
    overlapping(mem, off, bytes, [&](const Slot& s) {
      if (s.state != Slot::FILLING)
        fail("core %d: write into %s[%d] (offset %lld, %lld B) while it is %s, not being "
             "filled", id, s.name, s.index, (long long)off, (long long)bytes,
             state_name(s.state));
    });
    return dry ? nullptr : sp.at(off);
  }
  // Append an event; returns its (local) handle.
  int64_t emit(int engine, int op, int src, int dst, int64_t bytes, int64_t m, int64_t n,
               int64_t k, int64_t elems, int64_t aux, std::initializer_list<int64_t> deps,
               int phase_override = -1) {
    Event e{};
    e.id = kLocal | (int64_t)events.size();
    e.core = id;
    e.engine = engine;
    e.op = op;
    e.src = src;
    e.dst = dst;
    e.phase = phase_override >= 0 ? phase_override : phase;
    e.bytes = bytes;
    e.m = m;
    e.n = n;
    e.k = k;
    e.elems = elems;
    e.aux = aux;
    int nd = 0;
    for (int i = 0; i < kMaxDeps; ++i) e.deps[i] = kNone;
    auto add = [&](int64_t d) {
      if (d == kNone) return;
      for (int i = 0; i < nd; ++i)
        if (e.deps[i] == d) return;
      if (nd == kMaxDeps) fail("core %d: more than %d dependencies on one event", id, kMaxDeps);
      e.deps[nd++] = d;
    };
    if (!engine_after_barrier[engine]) {
      add(barrier_dep);
      engine_after_barrier[engine] = true;
    }
    for (int64_t d : deps)
      if (d != last[engine]) add(d);  // same queue: already ordered
    events.push_back(e);
    last[engine] = e.id;
    return e.id;
  }

  // ---- slot protocol -------------------------------------------------------------------
  // The dependency a filler must wait for before writing the slot (its previous reader).
  int64_t begin_fill(Slot& s, int64_t step) {
    if (s.state != Slot::FREE)
      fail("core %d: write into %s[%d] (step %lld) while it still holds step %lld (%s): "
           "the buffer is in use",
           id, s.name, s.index, (long long)step, (long long)s.step,
           s.state == Slot::READY ? "being read" : "filled, not consumed");
    s.state = Slot::FILLING;
    s.step = step;
    return s.free_ev;
  }
  void end_fill(Slot& s, int64_t step, int64_t ev) {
    if (s.state != Slot::FILLING || s.step != step)
      fail("core %d: %s[%d] marked filled for step %lld without begin_fill", id, s.name,
           s.index, (long long)step);
    s.state = Slot::FILLED;
    s.step = step;
    s.fill_ev = ev;
  }
  // The consumer waits for the fill; returns the dependency to put on its first event.
  int64_t wait(Slot& s, int64_t step) {
    if (s.state != Slot::FILLED || s.step != step)
      fail("core %d: wait on %s[%d] for step %lld but it %s", id, s.name, s.index,
           (long long)step, s.state == Slot::FREE ? "was never filled" : "holds another step");
    s.state = Slot::READY;
    return s.fill_ev;
  }
  // Every read checks that the consumer waited for the data it reads.
  void check_read(const Slot& s, int64_t step) const {
    if (s.step != step)
      fail("core %d: read of %s[%d] expecting step %lld but the slot holds step %lld "
           "(its DMA for that step was never issued)",
           id, s.name, s.index, (long long)step, (long long)s.step);
    if (s.state != Slot::READY)
      fail("core %d: read of %s[%d] (step %lld) before waiting for the DMA that fills it",
           id, s.name, s.index, (long long)step);
  }
  void release(Slot& s, int64_t step, int64_t ev) {
    check_read(s, step);
    s.state = Slot::FREE;
    s.free_ev = ev;
  }

  void make_ring(Ring& r, const char* name, int n, int64_t bytes_each) {
    r.slots.assign(n, Slot{});
    for (int i = 0; i < n; ++i) {
      r.slots[i].name = name;
      r.slots[i].index = i;
      r.slots[i].mem = LMEM;
      r.slots[i].bytes = bytes_each;
      r.slots[i].off = lmem.alloc(bytes_each, name);
    }
    rings.push_back(&r);
  }

  // A DMA: its copies go through `cp` (pieces of contiguous bytes); the event's byte and
  // piece counts are what those copies moved, never written beside them.
  struct Copy {
    Core& c;
    int64_t bytes = 0, runs = 0;   // runs: contiguous pieces
    int64_t descs = 0;             // descriptors (a gather's m)
    explicit Copy(Core& core) : c(core) {}
    void operator()(void* dst, const void* src, int64_t n) {
      if (!c.dry) {
        std::memcpy(dst, src, (size_t)n);
        c.copied += n;
      }
      bytes += n;
      ++runs;
      ++descs;
    }
    // One strided descriptor: `count` rows of `row` bytes from src (steps of sstep) to dst
    // (steps of dstep).  Source rows wrap within [base, base + span), so a faulty run
    // reads other rows of the buffer rather than past it.  Its contiguous pieces: one when
    // both sides are dense, else a row each.
    void rows(uint8_t* dst, int64_t dstep, const uint8_t* base, int64_t span,
              const uint8_t* src, int64_t sstep, int64_t row, int64_t count) {
      if (!c.dry) {
        const int64_t off = src - base;
        for (int64_t i = 0; i < count; ++i) {
          int64_t o = (off + i * sstep) % span;
          if (o + row > span) o = 0;
          std::memcpy(dst + i * dstep, base + o, (size_t)row);
        }
        c.copied += row * count;
      }
      bytes += row * count;
      runs += (dstep == row && sstep == row) ? 1 : count;
      ++descs;
    }
  };
  int64_t dma(int engine, int src, int dst, const Copy& cp,
              std::initializer_list<int64_t> deps, int phase_override = -1) {
    return emit(engine, OP_DMA, src, dst, cp.bytes, 0, 0, 0, 0, cp.runs, deps, phase_override);
  }
  // A descriptor-driven gather (token-sparse): its descriptors counted in the event's m
  // (the cost model charges each), its contiguous pieces in aux.
  int64_t gather(int engine, int src, int dst, const Copy& cp,
                 std::initializer_list<int64_t> deps) {
    return emit(engine, OP_DMA, src, dst, cp.bytes, cp.descs, 0, 0, 0, cp.runs, deps);
  }

  // Rewrite local handles to global ids once the phase's events got their place.
  int64_t to_global(int64_t h, int64_t base) const {
    return (h != kNone && (h & kLocal)) ? base + (h & ~kLocal) : h;
  }
  void finish_phase(int64_t base) {
    for (auto& e : events) {
      e.id = to_global(e.id, base);
      for (auto& d : e.deps) d = to_global(d, base);
    }
    for (auto& l : last) l = to_global(l, base);
    for (Ring* r : rings)
      for (auto& s : r->slots) {
        if (s.state != Slot::FREE)
          fail("core %d: %s[%d] still holds step %lld at the end of a phase", id, s.name,
               s.index, (long long)s.step);
        s.fill_ev = to_global(s.fill_ev, base);
        s.free_ev = to_global(s.free_ev, base);
      }
  }
};

// Run fn(core) for every core, on up to `threads` host threads; the first error (lowest
// core) is rethrown.  Each core only touches its own state and disjoint output regions.
template <class Fn>
void for_each_core(int cores, int threads, Fn fn) {
  std::vector<std::string> errs(cores);
  std::vector<int> kind(cores, 0);
  auto body = [&](int t, int nt) {
    for (int c = t; c < cores; c += nt) {
      try {
        fn(c);
      } catch (const ArgError& e) {
        errs[c] = e.what();
        kind[c] = 2;
      } catch (const std::exception& e) {
        errs[c] = e.what();
        kind[c] = 1;
      }
    }
  };
  const int nt = std::max(1, std::min(threads, cores));
  if (nt == 1) {
    body(0, 1);
  } else {
    std::vector<std::thread> pool;
    for (int t = 1; t < nt; ++t) pool.emplace_back(body, t, nt);
    body(0, nt);
    for (auto& th : pool) th.join();
  }
  for (int c = 0; c < cores; ++c) {
    if (kind[c] == 2) throw ArgError(errs[c]);
    if (kind[c] == 1) throw EmuError(errs[c]);
  }
}

// The chip: L2, the cores, the merged trace.
struct Chip {
  bool dry = true;
  int threads = 1;
  Space l2;
  std::vector<Core> cores;
  std::vector<Event> trace;
  int barriers = 0;

  void init(int ncores, int64_t lmem_bytes, int64_t lmem_granule, int64_t l2_bytes,
            int64_t l2_granule, bool dry_, int threads_) {
    dry = dry_;
    threads = threads_;
    l2 = Space("L2", l2_bytes, l2_granule, dry);
    cores.resize(ncores);
    for (int c = 0; c < ncores; ++c) {
      cores[c].id = c;
      cores[c].dry = dry;
      cores[c].lmem = Space("LMEM", lmem_bytes, lmem_granule, dry);
    }
  }

  // Run one phase on every core in parallel, then give its events global ids in core order
  // (deterministic whatever the threads did).
  template <class Fn>
  void phase(int ph, Fn fn) {
    for (auto& c : cores) c.phase = ph;
    for_each_core((int)cores.size(), threads, [&](int c) { fn(cores[c]); });
    for (auto& c : cores) {
      const int64_t base = (int64_t)trace.size();
      c.finish_phase(base);
      trace.insert(trace.end(), c.events.begin(), c.events.end());
      c.events.clear();
    }
  }

  // All cores synchronise: one BARRIER event per core waiting for that core's queues; every
  // engine's next event waits for it.
  void barrier(int ph) {
    const int number = barriers++;
    std::vector<int64_t> ids;
    for (auto& c : cores) {
      Event e{};
      e.id = (int64_t)trace.size();
      e.core = c.id;
      e.engine = BARRIER_ENGINE;
      e.op = OP_BARRIER;
      e.phase = ph;
      e.aux = number;
      for (int i = 0; i < kMaxDeps; ++i) e.deps[i] = kNone;
      int nd = 0;
      for (int q = 0; q < 3; ++q)
        if (c.last[q] != kNone) e.deps[nd++] = c.last[q];
      trace.push_back(e);
      c.barrier_dep = e.id;
      for (auto& f : c.engine_after_barrier) f = false;
    }
  }
};

}  // namespace sc11
