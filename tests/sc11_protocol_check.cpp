// Stand-alone checks of the emulator runtime (templates/sc11/runtime/machine.h): each case
// breaks the protocol or a capacity on purpose and must raise sc11::EmuError.
// Built and run by tests/test_sc11_emulator.py; prints one line per case.
#include <cstdio>
#include <functional>

#include "machine.h"

using namespace sc11;

static int check(const char* name, std::function<void()> f) {
  try {
    f();
  } catch (const EmuError& e) {
    std::printf("caught %s: %s\n", name, e.what());
    return 0;
  }
  std::printf("MISSED %s\n", name);
  return 1;
}

int main() {
  int bad = 0;
  auto core = [] {
    Core c;
    c.id = 0;
    c.lmem = Space("LMEM", 4 << 20, 1 << 20, false);
    return c;
  };
  bad += check("lmem_capacity", [&] {
    Core c = core();
    c.lmem.alloc(3 << 20, "a");
    c.lmem.alloc((1 << 20) + 1, "b");   // 2 banks after rounding: 5 > 4
  });
  bad += check("l2_capacity", [&] {
    Space l2("L2", 1024, 256, true);
    l2.alloc(1000, "x");
    l2.alloc(1, "y");
  });
  bad += check("dma_into_slot_in_use", [&] {
    Core c = core();
    Ring r;
    c.make_ring(r, "slot", 2, 64);
    c.end_fill(r[0], 0, c.emit(GDMA, OP_DMA, DDR, LMEM, 64, 0, 0, 0, 0, 1, {c.begin_fill(r[0], 0)}));
    c.begin_fill(r[2], 2);               // same slot, step 0 not consumed
  });
  bad += check("read_before_wait", [&] {
    Core c = core();
    Ring r;
    c.make_ring(r, "slot", 2, 64);
    c.end_fill(r[0], 0, c.emit(GDMA, OP_DMA, DDR, LMEM, 64, 0, 0, 0, 0, 1, {c.begin_fill(r[0], 0)}));
    c.check_read(r[0], 0);
  });
  bad += check("read_of_unfilled_step", [&] {
    Core c = core();
    Ring r;
    c.make_ring(r, "slot", 2, 64);
    c.end_fill(r[0], 0, c.emit(GDMA, OP_DMA, DDR, LMEM, 64, 0, 0, 0, 0, 1, {c.begin_fill(r[0], 0)}));
    c.wait(r[0], 0);
    c.check_read(r[1], 1);
  });
  bad += check("slot_held_at_phase_end", [&] {
    Core c = core();
    Ring r;
    c.make_ring(r, "slot", 1, 64);
    c.end_fill(r[0], 0, c.emit(GDMA, OP_DMA, DDR, LMEM, 64, 0, 0, 0, 0, 1, {c.begin_fill(r[0], 0)}));
    c.finish_phase(0);
  });
  // and the legal order passes
  {
    Core c = core();
    Ring r;
    c.make_ring(r, "slot", 2, 64);
    for (int s = 0; s < 5; ++s) {
      const int64_t dep = c.begin_fill(r[s], s);
      c.end_fill(r[s], s, c.emit(GDMA, OP_DMA, DDR, LMEM, 64, 0, 0, 0, 0, 1, {dep}));
      const int64_t w = c.wait(r[s], s);
      c.check_read(r[s], s);
      c.release(r[s], s, c.emit(BDC, OP_VECTOR, LMEM, LMEM, 0, 0, 0, 0, 1, 0, {w}));
    }
    c.finish_phase(0);
    std::printf("legal order ok, %zu events\n", c.events.size());
  }
  return bad;
}
