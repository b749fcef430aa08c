"""Synthetic SC11 traces for the cost-model tests (hand-built, known answers)."""

from __future__ import annotations

from mlagen.backends.sc11.costmodel import TraceBuilder
from mlagen.backends.sc11.trace import Engine, Mem


def pipeline(cores: int = 1, steps: int = 8, buffers: int = 2, tile_bytes: int = 1 << 18,
             m: int = 32, n: int = 512, k: int = 576, blocks: int = 4, barrier: bool = True,
             tb: TraceBuilder | None = None) -> TraceBuilder:
    """Each core: SDMA DDR->L2 gather, GDMA L2->LMEM, BDC blocks of matmul + softmax, for
    `steps` tiles, with `buffers` slots (1: no overlap); then a barrier over the cores."""
    tb = tb or TraceBuilder()
    for c in range(cores):
        sdma, gdma, last_bdc = [], [], []
        for s in range(steps):
            # slot reuse: the load of step s waits for the compute of step s - buffers
            free = last_bdc[s - buffers] if s >= buffers else -1
            a = tb.dma(c, Engine.SDMA, Mem.DDR, Mem.L2, tile_bytes, pieces=16,
                       deps=[free, sdma[-1] if sdma else -1])
            g = tb.dma(c, Engine.GDMA, Mem.L2, Mem.LMEM, tile_bytes, deps=[a, free])
            sdma.append(a)
            gdma.append(g)
            prev = g
            for _b in range(blocks):
                qk = tb.matmul(c, m, n // blocks, k, deps=[prev])
                sm = tb.vector(c, m * n // blocks, deps=[qk])
                prev = tb.matmul(c, m, 512, n // blocks, deps=[sm])
            last_bdc.append(prev)
        if barrier and cores > 1:
            tb.barrier(c, 0, deps=[last_bdc[-1]])
    return tb
