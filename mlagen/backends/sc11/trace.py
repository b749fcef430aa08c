"""The SC11 emulator's trace: one record per engine operation, as the C++ runtime writes it
(templates/sc11/runtime/trace.h keeps the same layout; a test checks both agree).

Within one (core, engine) queue, events run in id order.  Across engines and cores an event
waits for the events named in deps (-1 = unused slot).  A barrier is one BARRIER event per
participating core with the same `aux` (barrier number): all of them end together.
"""

from __future__ import annotations

import enum

import numpy as np


class Engine(enum.IntEnum):
    SDMA = 0      # DDR <-> L2 only (gathers paged KV into contiguous L2 buffers)
    GDMA = 1      # any memory <-> any memory, per core (DDR/L2 <-> LMEM)
    BDC = 2       # compute: matrix (cube) and vector units, per core
    BARRIER = 3   # all-core synchronisation


class Mem(enum.IntEnum):
    NONE = 0
    DDR = 1
    L2 = 2
    LMEM = 3


class Op(enum.IntEnum):
    DMA = 0       # a copy: src/dst memories, bytes (and `aux` = number of contiguous pieces)
    MATMUL = 1    # m x k @ k x n on the cube: flops = 2*m*n*k
    VECTOR = 2    # elementwise / reduction work on the vector unit: `elems` elements
    BARRIER = 3
    DEQUANT = 4   # 8-bit KV values -> the cube's 16-bit operands on the vector unit: `elems`
    #               vector operations (n = values written)


MAX_DEPS = 4

EVENT_DTYPE = np.dtype([
    ("id", "<i8"),
    ("core", "<i4"),
    ("engine", "<i4"),
    ("op", "<i4"),
    ("src", "<i4"),       # Mem
    ("dst", "<i4"),       # Mem
    ("phase", "<i4"),     # 0: weights/setup, 1: phase A, 2: phase B, 3: merge, 4: phase C
    ("bytes", "<i8"),
    ("m", "<i8"),
    ("n", "<i8"),
    ("k", "<i8"),
    ("elems", "<i8"),
    ("aux", "<i8"),       # DMA: pieces (pages) gathered; BARRIER: barrier number; else slot
    ("deps", "<i8", (MAX_DEPS,)),
])
assert EVENT_DTYPE.itemsize == 8 + 4 * 6 + 8 * 6 + 8 * MAX_DEPS
