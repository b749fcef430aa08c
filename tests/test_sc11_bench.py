"""The benchmark's mechanics on a synthetic dry run (the emulator's own is exercised by
test_sc11_bench_emulator.py once the emulator is there)."""

from __future__ import annotations

import pytest

from mlagen.backends.sc11 import bench
from mlagen.backends.sc11.costmodel import TraceBuilder, simulate
from mlagen.backends.sc11.schemes import SCHEMES, clear_cache
from mlagen.backends.sc11.trace import Engine, Mem


def fake_dry(schedule, inputs, scheme):
    """A kernel-shaped trace: each core its share of KV tiles (SDMA -> L2, GDMA -> LMEM,
    BDC), `buffers` slots, then a barrier."""
    cores, nb = schedule.mapping.cores, schedule.mapping.buffers
    tile, h = schedule.mapping.seq_tile, schedule.heads_per_device
    lens = inputs.cache_seqlens.tolist()
    work = {c: [] for c in range(cores)}            # (tokens, heads) per step
    for b, n in enumerate(lens):
        for t0 in range(0, n, tile):
            tok = min(tile, n - t0)
            if scheme == "heads":
                for c in range(cores):
                    work[c].append((tok, h // cores))
            elif scheme == "batch" or (scheme == "batch_seq" and len(lens) >= cores):
                work[b % cores].append((tok, h))
            else:
                per = -(-tok // cores)
                for c in range(cores):
                    work[c].append((min(per, max(tok - c * per, 0)) or 1, h))
    tb = TraceBuilder()
    for c in range(cores):
        last = []
        prev_s = -1
        for i, (tok, hh) in enumerate(work[c]):
            free = last[i - nb] if i >= nb else -1
            s = tb.dma(c, Engine.SDMA, Mem.DDR, Mem.L2, tok * 1152, deps=[free, prev_s])
            g = tb.dma(c, Engine.GDMA, Mem.L2, Mem.LMEM, tok * 1152, deps=[s, free])
            a = tb.matmul(c, hh, tok, 576, deps=[g])
            v = tb.vector(c, hh * tok, deps=[a])
            last.append(tb.matmul(c, hh, 512, tok, deps=[v]))
            prev_s = s
        tb.barrier(c, 0, deps=[last[-1]] if last else [])
    return tb.array()


def test_grid_table_and_choices(tmp_path):
    clear_cache()
    out = tmp_path / "grid.md"
    g = bench.bench_grid(batches=(1, 16), seqlens=(128, 2048), out=out, dry=fake_dry)
    assert len(g.points) == 4
    for p in g.points:
        for nb in (1, 2):
            assert set(p.times[nb]) == set(SCHEMES)
            best, t = p.best(nb)
            assert t == min(p.times[nb].values())
            assert p.auto[nb] == best                 # the same traces: auto is the argmin
        assert p.saving() >= -1e-9                    # never hurts; one tile: no overlap
    assert g.auto_ok()
    many = next(p for p in g.points if p.batch == 16 and p.seqlen == 2048)
    assert many.saving() > 0.1                        # many tiles per core: real overlap
    text = out.read_text()
    assert "| batch | seqlen | best |" in text and "assumed" in text.lower()
    assert text.count("\n| 16 | 2048 |") == 1
    # batch 1 cannot use the batch scheme well: one core works
    p1 = next(p for p in g.points if p.batch == 1 and p.seqlen == 2048)
    assert p1.times[2]["batch"] > p1.times[2]["seq"]


def test_seed_point_report(tmp_path):
    clear_cache()
    rep = bench.seed_point(dry=fake_dry, charts=tmp_path, batch=16, seqlen=1024)
    assert rep.double < rep.single
    assert rep.saving == pytest.approx(1 - rep.double / rep.single)
    assert rep.pipelined <= rep.double * 1.0001
    assert set(rep.checks()) == {"double buffering saves time",
                                 "double-buffered within 15% of the pipelined bound",
                                 "auto within 5% of the best (same reading)"}
    assert len(rep.files) == 8 and all(f.stat().st_size > 0 for f in rep.files)
    assert "pipelined bound" in rep.text()
    d = simulate(fake_dry(bench._with_buffers(bench._schedule(None), 2),
                          bench.dry_inputs(bench._schedule(None), 16, [1024] * 16),
                          rep.scheme))
    assert d.total_s == pytest.approx(rep.double)
