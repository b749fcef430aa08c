"""The Python model of the GPU split scheduler (templates/hopper/include/mla_scheduler.cuh).

The tests compare the CUDA/C++ scheduler with this model, and use it to explain a split:
which part runs which tokens of which request, and which partial slot each piece fills.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

SCHED_BLOCK = 64        # tokens per scheduler unit (any block_kv of 16/32/64 divides it)
FIXED_COST = 5          # blocks' worth of cost per split (load Q, write and combine a partial)
META_INTS = 8


def blocks(seqlen: int) -> int:
    return (seqlen + SCHED_BLOCK - 1) // SCHED_BLOCK if seqlen > 0 else 0


def row_tiles(rows_total: int, rows_per_tile: int) -> int:
    return -(-rows_total // rows_per_tile)


def num_parts(sms: int, rows_total: int, rows_per_tile: int) -> int:
    """Parts of the split: one CTA per (part, row tile), so about one CTA per SM."""
    return max(1, sms // row_tiles(rows_total, rows_per_tile))


def _first_last(cum: Sequence[int], nblk: Sequence[int], r: int, payload: int,
                fixed_cost: int) -> tuple[int, int]:
    """(first part, last part) holding request r's blocks (an empty request: the part
    holding its start)."""
    if nblk[r] == 0:
        return cum[r] // payload, cum[r] // payload
    return (cum[r] + fixed_cost) // payload, (cum[r] + fixed_cost + nblk[r] - 1) // payload


def plan(seqlens: Sequence[int], parts: int, fixed_cost: int = FIXED_COST, cluster: int = 1
         ) -> tuple[list[list[int]], list[int]]:
    """(metadata rows [parts][8], num_splits [b+1]): the arithmetic of plan_splits.  Request
    r occupies cost units [cum[r], cum[r+1]) (its overhead, then its blocks); part p owns
    [p * payload, (p + 1) * payload).  Or, with b <= parts, the equal plan: every request in
    pieces of at most L blocks, one piece a part, L the smallest that fits, when L is at most
    payload + fixed_cost; or the chunk plan: whole requests, ceil(b / parts) a part, when
    none of those chunks costs more than payload + fixed_cost.  With the split kernel
    launched in clusters of `cluster` > 1 CTAs, the cluster plan replaces the equal plan when
    its pieces are no longer (plan_cluster)."""
    nblk = [blocks(s) for s in seqlens]
    b = len(nblk)
    cum = [0]
    for n in nblk:
        cum.append(cum[-1] + n + fixed_cost)
    payload = max(1, -(-cum[-1] // parts))
    # equal pieces, one a part, when a piece is at most one split (F) larger than the payload
    piece = equal_piece(nblk, parts)
    if piece is not None and piece <= payload + fixed_cost:
        if cluster > 1 and b * cluster <= parts and -(-max([0, *nblk]) // cluster) <= piece:
            return plan_cluster(nblk, parts, cluster)
        return plan_equal(nblk, parts, piece)
    # whole requests, k a part, when no such chunk costs more than payload + one split
    k = -(-b // parts)
    starts = [min(p * k, b) for p in range(parts + 1)]
    if all(cum[starts[p + 1]] - cum[starts[p]] <= payload + fixed_cost for p in range(parts)):
        meta = [[starts[p], 0, starts[p + 1] - 1,
                 nblk[starts[p + 1] - 1] * SCHED_BLOCK if starts[p + 1] > starts[p] else 0,
                 0, 0, 0, 0] for p in range(parts)]
        return meta, list(range(b + 1))
    fl = [_first_last(cum, nblk, r, payload, fixed_cost) for r in range(b)]
    num_splits = [0]
    for f, l in fl:
        num_splits.append(num_splits[-1] + l - f + 1)
    meta = []
    for p in range(parts):
        mine = [r for r in range(b) if fl[r][0] <= p <= fl[r][1]]
        if not mine:
            r0 = next((r for r in range(b) if fl[r][1] >= p), b)
            meta.append([r0, 0, r0 - 1, 0, 0, 0, 0, 0])
            continue
        r0, r1 = mine[0], mine[-1]
        start = 0 if fl[r0][0] == p else (p * payload - cum[r0] - fixed_cost) * SCHED_BLOCK
        end = (nblk[r1] if fl[r1][1] == p else (p + 1) * payload - cum[r1] - fixed_cost) \
            * SCHED_BLOCK
        meta.append([r0, start, r1, end, p - fl[r0][0], 0, 0, 0])
    return meta, num_splits


def equal_piece(nblk: Sequence[int], parts: int) -> int | None:
    """The smallest piece size L (blocks) with sum over requests of max(1, ceil(n / L)) <=
    parts (every request at least one piece), or None when the batch has more requests than
    parts."""
    if len(nblk) > parts:
        return None
    lo, hi = 1, max([1, *nblk])
    while lo < hi:
        mid = (lo + hi) // 2
        if sum(max(1, -(-n // mid)) for n in nblk) <= parts:
            hi = mid
        else:
            lo = mid + 1
    return lo


def plan_equal(nblk: Sequence[int], parts: int, piece: int
               ) -> tuple[list[list[int]], list[int]]:
    """Request r in max(1, ceil(n_r / piece)) pieces of `piece` blocks (the last shorter),
    piece i of request r on part num_splits[r] + i; the parts past the last piece empty."""
    b = len(nblk)
    num_splits = [0]
    for n in nblk:
        num_splits.append(num_splits[-1] + max(1, -(-n // piece)))
    meta = [[b, 0, b - 1, 0, 0, 0, 0, 0] for _ in range(parts)]
    for r, n in enumerate(nblk):
        for i in range(num_splits[r + 1] - num_splits[r]):
            meta[num_splits[r] + i] = [r, i * piece * SCHED_BLOCK, r,
                                       min((i + 1) * piece, n) * SCHED_BLOCK, i, 0, 0, 0]
    return meta, num_splits


def plan_cluster(nblk: Sequence[int], parts: int, c: int) -> tuple[list[list[int]], list[int]]:
    """The cluster plan: request r in c near-equal pieces on parts r c .. r c + c - 1 (one
    cluster), each marked [5] = c: the cluster merges them on chip and writes the output, so
    num_splits counts one split a request; the parts past b c empty."""
    b = len(nblk)
    meta = [[b, 0, b - 1, 0, 0, 0, 0, 0] for _ in range(parts)]
    for r, n in enumerate(nblk):
        per = -(-n // c)
        for i in range(c):
            meta[r * c + i] = [r, min(per * i, n) * SCHED_BLOCK, r,
                               min(per * (i + 1), n) * SCHED_BLOCK, i, c, 0, 0]
    return meta, list(range(b + 1))


@dataclass(frozen=True)
class Piece:
    part: int
    request: int
    start: int      # first token
    end: int        # end token (exclusive), clamped to the sequence
    slot: int       # partial-result slot
    direct: bool    # the request's only split: written straight to the output
    merge: int = 0  # the cluster plan's c: merged on chip with the request's other pieces


def pieces(seqlens: Sequence[int], meta: Sequence[Sequence[int]], num_splits: Sequence[int]
           ) -> list[Piece]:
    """What the split kernel does with a plan: every (part, request) piece."""
    out = []
    b = len(seqlens)
    for p, md in enumerate(meta):
        first, last = md[0], md[2]
        for r in range(first, min(last, b - 1) + 1):
            s = max(seqlens[r], 0)
            start = md[1] if r == first else 0
            end = min(md[3] if r == last else s, s)
            start = min(start, end)
            slot = num_splits[r] + (md[4] if r == first else 0)
            out.append(Piece(p, r, start, end, slot, num_splits[r + 1] - num_splits[r] == 1,
                             md[5] if r == first else 0))
    return out


def cluster_lengths(rows_total: int, sms: int, rows_per_tile: int = 64) -> list[int]:
    """Lengths of one batch whose plan is the cluster plan (the 64-row kernel's merge through
    a 2-CTA cluster): parts / 2 requests, lengths 0, 1 and either side of page and block
    edges among 8-block ones (those keep the equal plan's pieces at 4 blocks, the cluster
    plan's halves no longer); [] where the parts cannot pair up.  The verifier's batches
    (<= 8 requests) never reach it otherwise."""
    parts = num_parts(sms, rows_total, rows_per_tile)
    b = parts // 2
    if parts % 2 or b * 4 <= parts:   # sched_cluster's condition for clusters of 2
        return []
    edges = [0, 1, 63, 64, 65, 127, 128, 129, 191, 192, 193, 255]
    lens = edges[:max(0, b - 1)] + [512] * max(1, b - len(edges))
    meta, _ = plan(lens, parts, cluster=2)
    return lens if all(md[5] == 2 for md in meta[:2 * b]) else []


def plan_fixed(seqlens: Sequence[int], n: int) -> tuple[list[list[int]], list[int]]:
    """A fixed split (split_kv = n): n near-equal pieces per request, parts = b * n."""
    meta, num_splits = [], [0]
    for r, s in enumerate(seqlens):
        nb = blocks(s)
        per = -(-nb // n)
        for i in range(n):
            b0, b1 = min(per * i, nb), min(per * (i + 1), nb)
            meta.append([r, b0 * SCHED_BLOCK, r, b1 * SCHED_BLOCK, i, 0, 0, 0])
        num_splits.append((r + 1) * n)
    return meta, num_splits
