"""`mlagen bench --target sc11`'s token-sparse rows: the sparse example schedules at their
decode points, every scheme simulated from dry-run traces, the best beside the cost
model's floor (floors.py: DDR bytes at the chip's bandwidth, matmul FLOPs at the cube peak).

    sparse_rows()  -> [SparseRow]      sparse_table(rows) (markdown)

A dry run moves no data, so the pools need only be as large as the slots the lists name:
every query row names topk distinct slots of a cache of `span` tokens (its sequence), pages
in order.  Two index patterns: "random" (each row its own random choice: no two entries
adjacent, a descriptor a token) and "windows" (what real lists look like: a two-pool
schedule's main pool is DeepSeek-V4's sliding window, the sequence's last topk tokens;
every other list is clusters, windows of 1 to CLUSTER consecutive tokens at random starts,
an assumed length).  With gather = "runs" a run of adjacent slots of a page is one
descriptor, so the pattern sets the descriptor count; the bytes are the same.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ... import formats
from ...paths import SCHEDULES_DIR
from ...problem import TORCH_DTYPES, FusedWeights, SparseInputs, SparsePool
from ...schedule import load
from ...schedule.records import Schedule
from .costmodel import simulate
from .floors import floor_s
from .schemes import SCHEMES, machine_for
from .trace import Engine, Op

# (example schedule, batch, s_q, main pool's sequence length, extra pool's)
POINTS = (
    ("sc11_sparse_ds_mla", 2, 2, 32768, 0),      # DSA decode: topk 2048 of 32k tokens
    ("sc11_sparse_ds_mla", 64, 2, 32768, 0),
    ("sc11_sparse_two_pools", 2, 2, 32768, 8192),   # a window-like main pool + a second one
    ("sc11_sparse_two_pools", 64, 2, 32768, 8192),
    ("sc11_sparse_v4_fp8", 2, 2, 32768, 8192),      # the same in fp8_ue8m0_paged pools
    ("sc11_sparse_v4_fp8", 64, 2, 32768, 8192),
    ("sc11_sparse_fused", 2, 2, 32768, 0),       # DSA's whole operator, q_lora to out
    ("sc11_sparse_fused", 64, 2, 32768, 0),
)
INDICES = ("random", "windows")
CLUSTER = 32     # "windows": the longest cluster of consecutive tokens (an assumption)


def _clusters(n: int, topk: int, g: torch.Generator) -> torch.Tensor:
    """topk distinct positions of [0, n): windows of 1 to CLUSTER consecutive positions at
    random starts, in the order drawn."""
    taken = torch.zeros(n, dtype=torch.bool)
    out: list[int] = []
    while len(out) < topk:
        w = int(torch.randint(1, CLUSTER + 1, (1,), generator=g))
        start = int(torch.randint(n, (1,), generator=g))
        for x in range(start, min(n, start + w)):
            if not taken[x] and len(out) < topk:
                taken[x] = True
                out.append(x)
    return torch.tensor(out)


def dry_sparse_inputs(s: Schedule, batch: int, s_q: int, span: int, extra_span: int,
                      seed: int = 0, indices: str = "random") -> SparseInputs:
    """Inputs for a dry run: caches left uninitialised (a dry run reads none of their
    bytes), lists of distinct valid slots in the pattern `indices` (INDICES)."""
    p = s.problem
    g = torch.Generator().manual_seed(seed)
    h = s.heads_per_device
    pools = []
    specs = [(p.topk, p.page_size, p.kv, span)]
    if p.extra_topk:
        specs.append((p.extra_topk, p.extra_page_size or p.page_size, p.extra_kv, extra_span))
    for i, (topk, page, fmt_name, n) in enumerate(specs):
        fmt = formats.get(fmt_name)
        n = max(n, topk)
        blocks = -(-n // page)
        dtype = torch.uint8 if fmt.quantized else TORCH_DTYPES[p.dtype]
        cache = torch.empty(blocks, page, 1, fmt.width(p.kv_lora_rank, p.rope_dim), dtype=dtype)
        if indices == "random":
            rows = [torch.randperm(n, generator=g)[:topk] for _ in range(batch * s_q)]
        elif i == 0 and p.extra_topk:        # the main pool of two: a sliding window
            rows = [torch.arange(n - topk, n)] * (batch * s_q)
        else:
            rows = [_clusters(n, topk, g) for _ in range(batch * s_q)]
        idx = torch.stack(rows).to(torch.int32)
        pools.append(SparsePool(cache, idx.view(batch, s_q, topk), None, fmt_name))
    dt = TORCH_DTYPES[p.dtype]
    sink = torch.zeros(h) if p.sinks else None
    if p.fused:     # q_lora and the weights (a dry run reads none), the tokens' positions
        w = FusedWeights(torch.empty(p.q_lora_rank, h, p.qk_nope_head_dim + p.rope_dim,
                                     dtype=dt),
                         torch.empty(h, p.qk_nope_head_dim, p.kv_lora_rank, dtype=dt),
                         torch.empty(h, p.kv_lora_rank, p.v_head_dim, dtype=dt))
        return SparseInputs(None, pools, p.default_scale(), sink, p.dv,
                            q_lora=torch.empty(batch, s_q, p.q_lora_rank, dtype=dt), weights=w,
                            cache_seqlens=torch.full((batch,), max(span, s_q),
                                                     dtype=torch.int32))
    q = torch.empty(batch, s_q, h, p.d, dtype=dt)
    return SparseInputs(q, pools, p.default_scale(), sink, p.dv)


@dataclass
class SparseRow:
    schedule: str
    indices: str            # INDICES
    batch: int
    s_q: int
    keys: int               # entries a query row attends to (both pools)
    heads: int
    kv: str
    scheme: str
    time_s: float
    floor_s: float
    gathered_mb: float      # SDMA bytes DDR -> L2
    descriptors: int
    descriptor_s: float     # descriptor time a core (the SDMA's per-token overhead)
    times: dict

    @property
    def ratio(self) -> float:
        return self.time_s / self.floor_s if self.floor_s else float("inf")


def sparse_row(name: str, batch: int, s_q: int, span: int, extra_span: int,
               indices: str = "random", **knobs) -> SparseRow:
    """knobs: schedule knobs to change (gather = "token": the per-token descriptors)."""
    from . import runner

    s = load(SCHEDULES_DIR / f"{name}.toml")
    s = s.replace(**knobs) if knobs else s
    p = s.problem
    run = runner(s)
    inp = dry_sparse_inputs(s, batch, s_q, span, extra_span, indices=indices)
    mc = machine_for(s)
    sims = {sc: simulate(run.dry_run(inp, sc), mc) for sc in SCHEMES}
    best = min(sims, key=lambda k: sims[k].total_s)
    sim = sims[best]
    ev = sim.events
    g = (ev["engine"] == Engine.SDMA) & (ev["op"] == Op.DMA)
    n = int(ev["m"][g].sum())
    return SparseRow(name, indices, batch, s_q, p.topk + p.extra_topk, s.heads_per_device,
                     p.kv, best,
                     sim.total_s, floor_s(sim), int(ev["bytes"][g].sum()) / 1e6, n,
                     n * mc.descriptor_cycles / mc.dma_hz / max(1, len(sim.cores)),
                     {k: v.total_s for k, v in sims.items()})


def sparse_rows(points=POINTS, indices=INDICES, **knobs) -> list[SparseRow]:
    return [sparse_row(*pt, indices=ix, **knobs) for pt in points for ix in indices]


def sparse_table(rows) -> str:
    us = 1e6
    out = ["## Token-sparse decode (attention = \"sparse\"; simulated, one chip)", "",
           "| schedule | indices | batch | s_q | keys a row | heads | KV | best scheme | "
           "time (us) | floor (us) | time / floor | SDMA gathered (MB) | descriptors | "
           "descriptor time a core (us) |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r.schedule} | {r.indices} | {r.batch} | {r.s_q} | {r.keys} | "
                   f"{r.heads} | {r.kv} | "
                   f"{r.scheme} | {r.time_s * us:.1f} | {r.floor_s * us:.1f} | "
                   f"{r.ratio:.2f} | {r.gathered_mb:.2f} | {r.descriptors} | "
                   f"{r.descriptor_s * us:.1f} |")
    out += ["", "Each query row gathers its keys with one SDMA descriptor per run of "
            "adjacent slots of a page (gather = \"runs\"; two for fp8_ue8m0_paged: a run's "
            "data rows and its scale rows; `dma_descriptor_cycles` in targets/sc11.toml, "
            "assumed): \"random\" lists are a descriptor a token, \"windows\" lists are a "
            "sliding window (a two-pool schedule's main pool) or clusters of 1 to "
            f"{CLUSTER} tokens; the floor counts the DDR bytes and matmul FLOPs only."]
    return "\n".join(out)
