"""A model of the 64-row wgmma kernel's K stages (mla_wgmma.cuh) under random interleavings:
two stages of nine 64-column slices, a `full` and an `empty` mbarrier per slice, the
producer refilling slices in the order slice_at(0..8) as each is let go, WG1 (S of block
i+1 issued before P V of block i; the rope slice and the right V half let go once S is done,
the left V half once its P V is done, mid-softmax of the next block) and WG2 (the right
half's P V after WG1's P-full).  mbarrier phases with try_wait.parity's rule, TMA boxes
landing late and in any order, per-warp arrivals.  Checks the protocol, not the CUDA code:
every slice a wgmma reads holds the block it expects for as long as the wgmma reads it, no
box lands on a slice a wgmma still reads, nothing deadlocks.  A mirror of the kernel's
slice_at and slice_readers (guarded by test_slice_order_matches_the_kernel)."""

from __future__ import annotations

import random
import subprocess

import pytest
from hopper_util import interleave

SLICES, STAGES = 9, 2


def slice_at(q: int) -> int:
    return 8 if q == 0 else (q + 3 if q <= 4 else q - 5)


def slice_readers(j: int) -> int:
    return 8 if 4 <= j < 8 else 4


def _run(pieces: list[int], rng: random.Random, readers=slice_readers,
         early_left=False, early_pair=False) -> None:
    """early_left: a planted bug, WG1 letting go of the left V half when S is done (before
    its P V has read it).  Each P V is two commit groups of two slices (issue_pv): a pair
    is let go once its group is done; early_pair: a planted bug, both pairs let go when the
    first group is done."""
    full_phase = [[0] * SLICES for _ in range(STAGES)]
    empty_phase = [[0] * SLICES for _ in range(STAGES)]
    empty_cnt = [[0] * SLICES for _ in range(STAGES)]
    data = [[None] * SLICES for _ in range(STAGES)]
    reading = [[0] * SLICES for _ in range(STAGES)]   # wgmmas reading the slice now
    inflight: list = []
    pfull, pempty = [0], [0]                           # blocks P-full / P-empty signalled

    def ready(phase: int, parity: int) -> bool:
        return (phase & 1) != parity

    def arrive(s: int, j: int, tag) -> None:
        assert data[s][j] == tag, ("let go of another block's slice", s, j, tag, data[s][j])
        empty_cnt[s][j] += 1
        if empty_cnt[s][j] == readers(j):
            empty_cnt[s][j] = 0
            empty_phase[s][j] += 1

    def start_read(s, j, tag):
        assert data[s][j] == tag, ("read", s, j, tag, data[s][j])
        reading[s][j] += 1

    def end_read(s, j, tag):
        assert data[s][j] == tag, ("overwritten while read", s, j, tag, data[s][j])
        reading[s][j] -= 1

    blocks = [(pi, i) for pi, n in enumerate(pieces) for i in range(n)]

    def producer():
        for it, (pi, i) in enumerate(blocks):
            s = it & 1
            for q in range(SLICES):
                j = slice_at(q)
                while not ready(empty_phase[s][j], ((it >> 1) & 1) ^ 1):
                    yield
                inflight.append((s, j, (pi, i, j)))
                yield

    def wait_full(s, j, it):
        while not ready(full_phase[s][j], (it >> 1) & 1):
            yield

    def warps_arrive(s, js, tag_of):
        order = list(range(4))
        rng.shuffle(order)
        for _ in order:
            for j in js:
                arrive(s, j, tag_of(j))
            yield

    def wg1():
        it = 0
        for pi, n in enumerate(pieces):
            if n == 0:
                continue

            def issue_s(b):                     # start_block: slices in refill order
                s = (it + b) & 1
                for q in range(SLICES):
                    j = slice_at(q)
                    yield from wait_full(s, j, it + b)
                    start_read(s, j, (pi, b, j))

            yield from issue_s(0)
            for i in range(n):
                s, sp = (it + i) & 1, (it + i - 1) & 1
                yield                                            # wgmma_wait<1>: S(i) done
                for j in range(SLICES):
                    end_read(s, j, (pi, i, j))
                yield from warps_arrive(s, [8, 4, 5, 6, 7] + ([0, 1, 2, 3] if early_left else []),
                                        lambda j: (pi, i, j))
                yield                                            # softmax
                if i > 0:                        # wait<1>, wait<0>: P V(i-1)'s two groups
                    for pair in ([0, 1], [2, 3]):
                        for j in pair:
                            end_read(sp, j, (pi, i - 1, j))
                        if not early_left:
                            free = [0, 1, 2, 3] if early_pair else pair
                            if not (early_pair and pair == [2, 3]):
                                yield from warps_arrive(sp, free, lambda j: (pi, i - 1, j))
                        yield
                    while pempty[0] < len(done_blocks) + i:      # bar_sync(PEmpty)
                        yield
                pfull[0] += 1                                    # P(i), bar_arrive(PFull)
                yield
                if i + 1 < n:
                    yield from issue_s(i + 1)
                for j in range(4):                               # P V(i), left half
                    start_read(s, j, (pi, i, j))
                yield
            last = (it + n - 1) & 1
            yield                                                # wait<0>
            for j in range(4):
                end_read(last, j, (pi, n - 1, j))
            if not early_left:
                yield from warps_arrive(last, [0, 1, 2, 3], lambda j: (pi, n - 1, j))
            while pempty[0] < len(done_blocks) + n:
                yield
            done_blocks.extend([None] * n)
            it += n

    done_blocks: list = []

    def wg2():
        for it, (pi, i) in enumerate(blocks):
            s = it & 1
            for j in range(4, 8):
                yield from wait_full(s, j, it)
            while pfull[0] <= it:                                # bar_sync(PFull)
                yield
            for j in range(4, 8):
                start_read(s, j, (pi, i, j))
            for pair in ([4, 5], [6, 7]):                        # P V right: wait<1>, <0>
                yield
                for j in pair:
                    end_read(s, j, (pi, i, j))
                free = [4, 5, 6, 7] if early_pair else pair
                if not (early_pair and pair == [6, 7]):
                    yield from warps_arrive(s, free, lambda j: (pi, i, j))
            pempty[0] += 1                                       # bar_arrive(PEmpty)

    def land(box) -> None:
        s, j, tag = box
        assert reading[s][j] == 0, ("a box landed on a slice being read", s, j, tag)
        data[s][j] = tag
        full_phase[s][j] += 1

    interleave([producer(), wg1(), wg2()], inflight, land, rng, 3_000_000, f"pieces {pieces}")


def test_stage_protocol_under_random_interleavings():
    rng = random.Random(7)
    for _ in range(200):
        pieces = [rng.choice([0, 1, 2, 3, 4, 5, 8, 13]) for _ in range(rng.randint(1, 4))]
        _run(pieces, rng)


def test_the_model_catches_an_early_release():
    """Teeth: the left V half let go when S is done (its P V still to read it), or the
    right half freed by WG1 alone (4 arrivals, not 8): a box lands on a slice being read,
    or a read finds another block's data."""
    for bad in (dict(early_left=True), dict(readers=lambda j: 4), dict(early_pair=True)):
        with pytest.raises(AssertionError):
            for seed in range(40):
                _run([6, 5, 7], random.Random(seed), **bad)


def test_slice_order_matches_the_kernel(tmp_path):
    from mlagen.paths import TEMPLATES_DIR

    src = tmp_path / "order.cu"
    src.write_text('#include <cstdio>\n#include "mla_wgmma.cuh"\nint main() {\n'
                   '  using C = mlagen::hopper::WgmmaConfig;\n'
                   '  for (int q = 0; q < C::kSlices; ++q)\n'
                   '    std::printf("%d %d\\n", C::slice_at(q), C::slice_readers(q));\n'
                   '  return 0;\n}\n')
    exe = tmp_path / "order"
    subprocess.run(["nvcc", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a",
                    "-I", str(TEMPLATES_DIR / "hopper" / "include"), str(src), "-o", str(exe)],
                   check=True, capture_output=True)
    got = [tuple(map(int, ln.split())) for ln in
           subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split("\n")
           if ln.strip()]
    assert got == [(slice_at(q), slice_readers(q)) for q in range(SLICES)]
