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
  // address checks: the bookkeeping calls agree, the bytes touched do not
  bad += check("read_of_slot_being_filled_by_address", [&] {
    Core c = core();
    c.lmem.commit();
    Ring r;
    c.make_ring(r, "slot", 2, 64);
    c.lmem.commit();
    for (int s = 0; s < 2; ++s)
      c.end_fill(r[s], s, c.emit(GDMA, OP_DMA, DDR, LMEM, 64, 0, 0, 0, 0, 1, {c.begin_fill(r[s], s)}));
    c.wait(r[0], 0);
    c.check_read(r[0], 0);               // step 0 is ready ...
    c.rd(c.lmem, LMEM, r[1].off, 64);    // ... but these bytes are step 1's, still in flight
  });
  bad += check("read_straddling_into_slot_being_filled", [&] {
    Core c = core();
    Ring r;
    c.make_ring(r, "slot", 2, 64);
    c.lmem.commit();
    c.end_fill(r[0], 0, c.emit(GDMA, OP_DMA, DDR, LMEM, 64, 0, 0, 0, 0, 1, {c.begin_fill(r[0], 0)}));
    c.wait(r[0], 0);
    c.begin_fill(r[1], 1);
    c.rd(c.lmem, LMEM, r[0].off, r[1].off - r[0].off + 1);   // one byte into slot 1
  });
  bad += check("write_into_ready_slot_by_address", [&] {
    Core c = core();
    Ring r;
    c.make_ring(r, "slot", 2, 64);
    c.lmem.commit();
    c.end_fill(r[0], 0, c.emit(GDMA, OP_DMA, DDR, LMEM, 64, 0, 0, 0, 0, 1, {c.begin_fill(r[0], 0)}));
    c.wait(r[0], 0);
    c.wr(c.lmem, LMEM, r[0].off + 8, 8);  // a DMA scribbling on data being read
  });
  // and the legal order passes
  {
    Core c = core();
    Ring r;
    c.make_ring(r, "slot", 2, 64);
    c.lmem.commit();
    for (int s = 0; s < 5; ++s) {
      const int64_t dep = c.begin_fill(r[s], s);
      c.end_fill(r[s], s, c.emit(GDMA, OP_DMA, DDR, LMEM, 64, 0, 0, 0, 0, 1, {dep}));
      const int64_t w = c.wait(r[s], s);
      c.check_read(r[s], s);
      c.rd(c.lmem, LMEM, r[s].off, 64);
      c.release(r[s], s, c.emit(BDC, OP_VECTOR, LMEM, LMEM, 0, 0, 0, 0, 1, 0, {w}));
    }
    c.finish_phase(0);
    std::printf("legal order ok, %zu events\n", c.events.size());
  }
  return bad;
}
