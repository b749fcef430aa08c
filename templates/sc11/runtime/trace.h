// SC11 emulator trace record: one per engine operation.  Same layout as
// mlagen/backends/sc11/trace.py EVENT_DTYPE (a test checks that both agree).
#pragma once
#include <cstdint>

namespace sc11 {

enum Engine : int32_t { SDMA = 0, GDMA = 1, BDC = 2, BARRIER_ENGINE = 3 };
enum Mem : int32_t { MEM_NONE = 0, DDR = 1, L2 = 2, LMEM = 3 };
// OP_DEQUANT: the vector unit turning 8-bit KV values into the cube's 16-bit operands
enum Op : int32_t { OP_DMA = 0, OP_MATMUL = 1, OP_VECTOR = 2, OP_BARRIER = 3, OP_DEQUANT = 4 };
enum Phase : int32_t { PH_SETUP = 0, PH_A = 1, PH_B = 2, PH_MERGE = 3, PH_C = 4 };

constexpr int kMaxDeps = 4;

struct Event {
  int64_t id;
  int32_t core, engine, op, src, dst, phase;
  int64_t bytes, m, n, k, elems;
  int64_t aux;               // DMA: contiguous pieces; BARRIER: barrier number; else slot
  int64_t deps[kMaxDeps];    // ids of events this one waits for; -1 = unused
};
static_assert(sizeof(Event) == 112, "Event must match EVENT_DTYPE (112 bytes)");

}  // namespace sc11
