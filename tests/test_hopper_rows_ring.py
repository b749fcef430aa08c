"""A model of the slot ring of the few-rows wgmma kernel (mla_wgmma_rows.cuh) under random
interleavings, one or two consumer warpgroups: mbarrier phases with try_wait.parity's rule
(the wait for parity P returns once the barrier's current phase has the other parity), TMA
boxes landing late and in any order, per-warp arrivals (empty barriers count 4), the rope
slice handed back after S^T with two warpgroups, the merge barrier at a piece's end.  It
checks the protocol the kernel implements (Ring, skip_blocks, the producer's block order),
not the CUDA code itself: every slice a warpgroup reads holds the block it expects, no slot
is refilled before its reader hands it back, and nothing deadlocks (empty pieces, odd block
counts, rings of 18-27 slots).  A mirror of the kernel's ring arithmetic: change both."""

from __future__ import annotations

import random

import pytest
from hopper_util import interleave

SLICES = 9


def _run(kslots: int, pieces: list[int], wgs: int, rng: random.Random,
         wg1_skew: int = 0) -> None:
    """wg1_skew: a planted bug, WG1's ring position that many blocks short."""
    full_phase = [0] * kslots
    empty_phase, empty_cnt = [0] * kslots, [0] * kslots
    data: list = [None] * kslots
    inflight: list = []             # TMA boxes issued, not landed: (slot, tag)
    merged = [0] * len(pieces)

    def ready(phase: int, parity: int) -> bool:
        return (phase & 1) != parity

    def producer():                 # WgmmaRowsKernel::producer: blocks in order
        slot = lap = 0
        for pi, n in enumerate(pieces):
            for i in range(n):
                for j in range(SLICES):
                    while not ready(empty_phase[slot], (lap & 1) ^ 1):
                        yield
                    inflight.append((slot, (pi, i, j)))
                    slot += 1
                    if slot == kslots:
                        slot, lap = 0, lap + 1
                    yield

    def consumer(wg: int):          # WgmmaRowsKernel::consumer
        slot = lap = 0              # rg: the piece's first block
        for pi, n in enumerate(pieces):
            for i in range(wg, n, wgs):
                if wgs == 2:        # rb = rg; rb.skip_blocks(i)
                    s2 = slot + (i - (wg1_skew if wg == 1 else 0)) * SLICES
                    l2, s2 = lap + s2 // kslots, s2 % kslots
                else:
                    s2, l2 = slot, lap
                slot0 = s2
                for j in range(SLICES):     # start_block
                    while not ready(full_phase[s2], l2 & 1):
                        yield
                    assert data[s2] == (pi, i, j), ("read", wg, pi, i, j, data[s2])
                    s2 += 1
                    if s2 == kslots:
                        s2, l2 = 0, l2 + 1
                if wgs == 1:
                    slot, lap = s2, l2
                yield                       # S^T

                def arrive(j: int) -> None:
                    sl = (slot0 + j) % kslots
                    assert data[sl] == (pi, i, j), ("refilled early", wg, pi, i, j)
                    empty_cnt[sl] += 1
                    if empty_cnt[sl] == 4:
                        empty_cnt[sl] = 0
                        empty_phase[sl] += 1
                warps = list(range(4))
                rng.shuffle(warps)
                if wgs == 2:                # the rope slice after S^T
                    for _ in warps:
                        arrive(SLICES - 1)
                        yield
                yield                       # softmax, P V
                for _ in warps:             # lane j of each warp: slice j
                    for j in range(SLICES if wgs == 1 else SLICES - 1):
                        arrive(j)
                    yield
            if wgs == 2:                    # rg.skip_blocks(n), then the merge barrier
                slot += n * SLICES
                lap, slot = lap + slot // kslots, slot % kslots
                merged[pi] += 1
                while merged[pi] < 2:
                    yield

    def land(box) -> None:
        sl, tag = box
        data[sl] = tag
        full_phase[sl] += 1

    interleave([producer()] + [consumer(w) for w in range(wgs)], inflight, land, rng,
               2_000_000, f"slots {kslots}, pieces {pieces}, {wgs} consumer WGs")


@pytest.mark.parametrize("wgs", [1, 2])
def test_ring_protocol_under_random_interleavings(wgs):
    rng = random.Random(wgs)
    for _ in range(150):
        # 25 / 23 / 22 slots: the kernel's rings (16 or 32 rows, one or two WGs)
        kslots = rng.choice([18, 19, 22, 23, 25, 27])
        pieces = [rng.choice([0, 1, 2, 3, 4, 5, 7, 9, 30]) for _ in range(rng.randint(1, 5))]
        _run(kslots, pieces, wgs, rng)


def test_the_model_catches_a_wrong_ring_position():
    """The model has teeth: WG1 positioned one block short (its blocks' slices looked for
    in WG0's slots) reads another block's data or deadlocks."""
    with pytest.raises(AssertionError):
        _run(25, [3, 4], 2, random.Random(0), wg1_skew=1)
