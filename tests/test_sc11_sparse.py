"""Token-sparse attention on SC11 (attention = "sparse"): the emulator's result against
mlagen.reference.sparse_attention on the example schedules (both pools, sinks, d_qk 512 /
v_dim 448, fp8_ds_mla pools), the gather's DMA work in the trace and the cost model, the
input checks, and the planted sparse faults."""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
import pytest
import torch

import mlagen
from mlagen import formats, kvformat
from mlagen.backends.sc11 import tracecheck
from mlagen.backends.sc11.resources import sc11_heads_per_core
from mlagen.backends.sc11.costmodel import default_machine, event_costs, simulate
from mlagen.backends.sc11.trace import Engine, Op
from mlagen.errors import InputError
from mlagen.paths import SCHEDULES_DIR
from mlagen.problem import MlaOutputs, make_inputs, make_sparse_inputs
from mlagen.reference import attention, sparse_attention
from mlagen.schedule import load
from mlagen.schedule.records import Schedule
from mlagen.verify.compare import compare
from mlagen.verify.adversarial import _named
from mlagen.verify.sparse import SparseCase

EXAMPLES = ("sc11_sparse_two_pools", "sc11_sparse_ds_mla")


@functools.lru_cache(maxsize=None)
def schedule(name: str, fault: str = "none") -> Schedule:
    s = load(SCHEDULES_DIR / f"{name}.toml")
    return s.with_fault(fault) if fault != "none" else s


@functools.lru_cache(maxsize=None)
def runner(name: str, fault: str = "none"):
    return mlagen.runner(schedule(name, fault))


def reference(inp) -> MlaOutputs:
    out, lse = sparse_attention(inp.q, inp.pools, dv=inp.dv, softmax_scale=inp.softmax_scale,
                                attn_sink=inp.attn_sink, dtype=torch.float64)
    return MlaOutputs(out, lse)


def inputs(name: str, seqlens=(300, 5), s_q: int = 2, seed: int = 0, **kw):
    s = schedule(name)
    return make_sparse_inputs(s.problem, len(seqlens), list(seqlens), s_q=s_q,
                              heads=s.heads_per_device, seed=seed, **kw)


DRAWS = {"plain": {}, "holes": dict(invalid=0.3, repeats=0.3, topk_length=True),
         "sinks_inf": dict(infinite_sinks=True, invalid=0.1)}


@pytest.mark.parametrize("name", EXAMPLES)
@pytest.mark.parametrize("draw", sorted(DRAWS))
@pytest.mark.parametrize("scheme", ("heads", "seq", "batch_seq"))
def test_matches_the_sparse_reference(name, draw, scheme):
    inp = inputs(name, seed=len(draw), **DRAWS[draw])
    got = runner(name)(inp, scheme=scheme)
    cmp = compare(got, reference(inp), schedule(name).problem.dtype)
    assert cmp.ok, cmp.summary()


def test_rows_without_a_key_give_zero_and_lse_inf():
    """Every entry invalid, topk_length 0, or sequences of length 0: out 0, lse +inf."""
    name = "sc11_sparse_two_pools"
    for kw in (dict(invalid=1.0), dict(seqlens=(0, 0))):
        inp = inputs(name, **kw)
        got = runner(name)(inp, scheme="seq")
        assert torch.equal(got.out, torch.zeros_like(got.out))
        assert torch.isinf(got.lse).all() and (got.lse > 0).all()
    inp = inputs(name, topk_length=True)
    for p in inp.pools:
        p.topk_length.zero_()
    got = runner(name)(inp)
    assert torch.equal(got.out, torch.zeros_like(got.out)) and (got.lse == math.inf).all()


@pytest.mark.parametrize("name", EXAMPLES)
def test_the_drawn_case_nan_fills_every_unnamed_slot(name):
    """SparseCase.inputs() writes NaN into every slot no valid entry names: the kernel
    still matches (it reads none of them), and the cache does hold NaN."""
    s = schedule(name)
    case = SparseCase(s.problem, 3, 2, s.heads_per_device, (40, 300, 0),
                      (7, 600, 2) if s.problem.extra_topk else (), 5, invalid=0.2,
                      repeats=0.2, topk_length=True, zero_length=(0,), empty_rows=((1, 1),),
                      infinite_sinks=s.problem.sinks, data="rising", data_arg=3)
    inp = case.inputs()
    for p in inp.pools:
        vals = kvformat.dequantize(p.k_cache, p.kv_format, None, s.problem.kv_lora_rank)
        vals = vals.reshape(-1, vals.shape[-1])
        named = torch.zeros(vals.shape[0], dtype=torch.bool)
        for b in range(case.batch):
            for q in range(case.s_q):
                named[_named(p, b, q)] = True
        assert torch.isfinite(vals[named]).all()
        assert torch.isnan(vals[~named]).any(dim=-1).all()     # every other slot is NaN
    got = runner(name)(inp, scheme="batch")
    cmp = compare(got, reference(inp), s.problem.dtype)
    assert cmp.ok, cmp.summary()
    assert torch.isfinite(got.out[1, 0]).all()


def _valid_entries(inp) -> int:
    n = 0
    for p in inp.pools:
        idx = p.indices.long()
        keep = idx >= 0
        if p.topk_length is not None:
            keep &= torch.arange(idx.shape[-1])[None, None, :] < p.topk_length.long()[:, None, None]
        n += int(keep.sum())
    return n


def _runs(inp, s: Schedule, tile: int) -> int:
    """Maximal runs, counted here from the tensors: per query row, its kept entries in list
    order (main pool, then extra), a run being entries naming slot, slot + 1, ... of one
    page of one pool, within one tile of `tile` entries (scheme batch: a row is one piece
    cut into tiles from its first entry)."""
    pages = (s.problem.page_size, s.problem.extra_page_size or s.problem.page_size)
    b_n, s_n = inp.q.shape[:2]
    n = 0
    for b in range(b_n):
        for q in range(s_n):
            row = []
            for i, p in enumerate(inp.pools):
                keep = p.indices.shape[-1] if p.topk_length is None else int(p.topk_length[b])
                row += [(i, x) for x in p.indices[b, q, :keep].tolist()]
            prev = None
            for e, (i, x) in enumerate(row):
                if x < 0:
                    prev = None
                    continue
                joined = (prev is not None and e % tile and prev == (i, x - 1)
                          and x % pages[i])
                n += not joined
                prev = (i, x)
    return n


@pytest.mark.parametrize("gather", ("runs", "token"))
@pytest.mark.parametrize("name", EXAMPLES)
def test_the_gather_moves_exactly_the_named_tokens(name, gather):
    """One SDMA descriptor per maximal run of adjacent slots ("runs") or per valid entry
    ("token"), every scheme, each token's bytes once; the index lists come in by GDMA; the
    trace keeps the multi-buffer protocol."""
    s = schedule(name).replace(gather=gather)
    p = s.problem
    kvb = formats.get(p.kv).token_bytes(p.kv_lora_rank, p.rope_dim)
    inp = inputs(name, invalid=0.4, repeats=0.2, topk_length=True)
    want = _valid_entries(inp)
    run = mlagen.runner(s)
    for scheme in ("heads", "batch", "seq", "batch_seq"):
        tr = run(inp, scheme=scheme).extra["trace"]
        sdma = tr[(tr["engine"] == Engine.SDMA) & (tr["op"] == Op.DMA)]
        # heads: every core with heads reads every row's keys; the others split the rows
        readers = -(-s.heads_per_device // sc11_heads_per_core(s)) if scheme == "heads" else 1
        if gather == "token":
            assert int(sdma["m"].sum()) == want * readers, scheme
        else:
            assert int(sdma["m"].sum()) <= want * readers, scheme
        if scheme == "batch":
            assert int(sdma["m"].sum()) == (_runs(inp, s, s.mapping.seq_tile)
                                            if gather == "runs" else want)
        assert int(sdma["aux"].sum()) == int(sdma["m"].sum())      # a piece a descriptor
        assert int(sdma["bytes"].sum()) == want * readers * kvb
        assert tracecheck.check(tr, s.mapping.buffers, p.d) == [], scheme


@pytest.mark.parametrize("name", EXAMPLES + ("sc11_sparse_v4_fp8",))
def test_runs_and_token_gathers_give_identical_outputs(name):
    """On lists of windows (runs across pages, cut by -1, repeats, topk_length and tiles)
    "runs" gives the bits "token" gives, with as many descriptors as maximal runs counted
    independently (paged: two a run), far fewer than tokens, and matches the reference."""
    from mlagen.verify.sparse import sparse_path_cases

    s = schedule(name)
    assert s.mapping.gather == "runs"                   # the default
    token = mlagen.runner(s.replace(gather="token"))
    pieces = 2 if formats.get(s.problem.kv).paged else 1
    cases = [c for c in sparse_path_cases(s) if c.windows]
    assert cases
    for case in cases:
        inp = case.inputs()
        a, b = runner(name)(inp, scheme="batch"), token(inp, scheme="batch")
        assert torch.equal(a.out.view(torch.int16), b.out.view(torch.int16)), case.describe()
        assert torch.equal(a.lse, b.lse), case.describe()
        assert compare(a, reference(inp), "bf16").ok, case.describe()
        m = [int(x.extra["trace"]["m"][(x.extra["trace"]["engine"] == Engine.SDMA)
                                        & (x.extra["trace"]["op"] == Op.DMA)].sum())
             for x in (a, b)]
        runs = _runs(inp, s, s.mapping.seq_tile)
        assert m == [runs * pieces, _valid_entries(inp) * pieces], case.describe()
        assert 3 * runs < _valid_entries(inp), case.describe()     # windows: long runs
        for scheme in ("heads", "seq", "batch_seq"):   # runs cut where a core's piece ends
            a, b = runner(name)(inp, scheme=scheme), token(inp, scheme=scheme)
            assert torch.equal(a.out.view(torch.int16), b.out.view(torch.int16)), scheme
            assert torch.equal(a.lse, b.lse), scheme


def test_verify_draws_lists_of_windows():
    """The drawn sparse cases include lists of windows, whose rows hold runs of adjacent
    slots longer than one (what the run-building code needs to be exercised)."""
    from hypothesis import find, settings
    from mlagen.verify.sparse import sparse_cases

    s = schedule("sc11_sparse_ds_mla")
    case = find(sparse_cases(s), lambda c: c.windows and max(c.seqlens) > 8,
                settings=settings(database=None, max_examples=200))
    idx = case.inputs().pools[0].indices
    assert bool(((idx[..., 1:] == idx[..., :-1] + 1) & (idx[..., :-1] >= 0)).any())


def test_verify_draws_lengths_past_the_list():
    """Drawn and path cases hold a row whose topk_length passes its list in every pool (a
    kernel must clip it: the whole list, not the next row's entries), and the reference
    keeps that row's whole list."""
    from hypothesis import find, settings
    from mlagen.verify.sparse import sparse_cases, sparse_path_cases

    s = schedule("sc11_sparse_two_pools")
    drawn = find(sparse_cases(s), lambda c: bool(c.long_length),
                 settings=settings(database=None, max_examples=200))
    path = [c for c in sparse_path_cases(s) if c.long_length]
    assert path
    for case in (drawn, path[0]):
        inp = case.inputs()
        r = case.long_length[0]
        for pool in inp.pools:
            assert int(pool.topk_length[r]) > pool.indices.shape[-1], case.describe()
        whole = [dataclasses.replace(p, topk_length=None) for p in inp.pools]
        a = reference(inp)
        b = reference(dataclasses.replace(inp, pools=whole))
        assert torch.equal(a.out[r], b.out[r]), case.describe()


def test_a_run_stops_at_a_page_edge_a_repeat_and_a_hole():
    """Hand-made lists: adjacent slots across a page edge are two runs, a repeated slot
    starts a new run, -1 and topk_length cut a run."""
    name = "sc11_sparse_ds_mla"
    s = schedule(name)
    pg = s.problem.page_size
    inp = inputs(name, seqlens=(4 * pg,), s_q=1)
    p = inp.pools[0]
    idx = torch.full_like(p.indices, -1)
    row = [pg - 2, pg - 1, pg, pg + 1,     # two runs: the page edge cuts
           5, 5, 6,                        # 5 | 5, 6: a repeat is a new key
           9, -1, 10, 11,                  # 9 | 10, 11
           30, 31, 32]                     # kept up to topk_length: 30, 31
    idx[0, 0, :len(row)] = torch.tensor(row)
    tl = torch.tensor([len(row) - 1], dtype=torch.int32)
    inp = dataclasses.replace(inp, pools=[dataclasses.replace(p, indices=idx, topk_length=tl)])
    got = runner(name)(inp, scheme="batch")
    tr = got.extra["trace"]
    m = int(tr["m"][(tr["engine"] == Engine.SDMA) & (tr["op"] == Op.DMA)].sum())
    assert m == 2 + 2 + 2 + 1 == _runs(inp, s, s.mapping.seq_tile)
    assert compare(got, reference(inp), "bf16").ok


def test_descriptors_cost_dma_time():
    """The cost model charges a gather's descriptors (targets/sc11.toml
    dma_descriptor_cycles): with them free the sparse run is faster."""
    mc = default_machine()
    assert mc.descriptor_cycles > 0
    inp = inputs("sc11_sparse_ds_mla", seqlens=(3000, 2500))
    tr = runner("sc11_sparse_ds_mla")(inp, scheme="batch_seq").extra["trace"]
    sd = tr[(tr["engine"] == Engine.SDMA)][:1]
    fixed, _, _ = event_costs(sd, mc)
    free, _, _ = event_costs(sd, mc.replace(descriptor_cycles=0))
    assert fixed[0] - free[0] == pytest.approx(int(sd["m"][0]) * mc.descriptor_cycles / mc.dma_hz)
    assert simulate(tr, mc).total_s > simulate(tr, mc.replace(descriptor_cycles=0)).total_s


def test_mlagen_run_takes_sparse_inputs():
    s = schedule("sc11_sparse_two_pools")
    inp = inputs("sc11_sparse_two_pools", seqlens=(50,), s_q=1)
    got = mlagen.run(s, inp)
    assert got.out.shape == (1, 1, 16, 448) and got.lse.shape == (1, 16, 1)
    assert compare(got, reference(inp), "bf16").ok


def test_bad_sparse_inputs_are_refused():
    name = "sc11_sparse_two_pools"
    r = runner(name)
    inp = inputs(name, seqlens=(20,), s_q=1)
    with pytest.raises(InputError, match="1 pools given; the schedule has 2"):
        r(dataclasses.replace(inp, pools=inp.pools[:1]))
    far = dataclasses.replace(inp.pools[0], indices=inp.pools[0].indices.clone())
    far.indices[0, 0, 0] = far.k_cache.shape[0] * far.k_cache.shape[1]
    with pytest.raises(InputError, match="indices name slot"):
        r(dataclasses.replace(inp, pools=[far, inp.pools[1]]))
    with pytest.raises(InputError, match="attn_sink"):
        r(dataclasses.replace(inp, attn_sink=None))
    with pytest.raises(InputError, match="takes SparseInputs"):
        r(make_inputs(dataclasses.replace(schedule(name).problem, attention="dense", topk=0,
                                          extra_topk=0, extra_page_size=0, sinks=False),
                      1, [20], heads=16))
    with pytest.raises(InputError, match="s_q = 3"):
        r(inputs(name, seqlens=(20,), s_q=3))


def test_dense_attention_takes_the_512_key_shape():
    """d_qk 512 with V 448 (latent 448 + rope 64), as data in the problem: the dense path
    of the same shape runs too."""
    s = Schedule.build(target="sc11", heads=16, tp=1, kv_lora_rank=448, rope_dim=64,
                       v_dim=448, page_size=64, fused=False, max_s_q=2, cores=4,
                       block_kv=32, seq_tile=128)
    inp = make_inputs(s.problem, 2, [100, 7], s_q=2, heads=16, seed=1)
    got = mlagen.run(s, inp)
    out, lse = attention(inp.q, inp.k_cache, inp.block_table, inp.cache_seqlens, dv=448,
                         softmax_scale=inp.softmax_scale, causal=True, dtype=torch.float64)
    assert compare(got, MlaOutputs(out, lse), "bf16").ok


# planted faults (records.FAULTS), each with the inputs that show it
FAULT_CASES = {
    "sparse_offset_off_by_one": ("sc11_sparse_ds_mla", {}),
    "sparse_invalid_read": ("sc11_sparse_ds_mla", dict(invalid=0.3)),
    "sparse_topk_length_plus_one": ("sc11_sparse_two_pools", dict(topk_length=True)),
    "sink_in_lse": ("sc11_sparse_two_pools", {}),
    "sink_sign": ("sc11_sparse_two_pools", {}),
    "extra_page_for_main": ("sc11_sparse_two_pools", {}),
}


@pytest.mark.parametrize("fault", sorted(FAULT_CASES))
def test_planted_sparse_faults_are_seen(fault):
    name, kw = FAULT_CASES[fault]
    inp = inputs(name, seqlens=(300, 700), **kw)
    got = runner(name, fault)(inp, scheme="batch")
    assert not compare(got, reference(inp), "bf16").ok, fault
    # the same inputs pass without the fault
    assert compare(runner(name)(inp, scheme="batch"), reference(inp), "bf16").ok


def test_sparse_lmem_layout_matches_the_emulator():
    from mlagen.backends.sc11.resources import sc11_layout
    from mlagen.schedule.rules import plan_of

    for name in EXAMPLES:
        s = schedule(name)
        got = runner(name)(inputs(name), scheme="batch").extra
        lay = sc11_layout(s, plan_of(s).target)
        assert got["lmem_high"] <= lay["lmem"], name
        assert np.isclose(got["l2_static"], lay["l2"]), name


def test_bench_rows_put_the_floor_beside_the_time():
    from mlagen.backends.sc11.sparse_bench import POINTS, sparse_rows, sparse_table

    rows = sparse_rows([pt for pt in POINTS if pt[1] == 2])
    assert {r.schedule for r in rows} == set(EXAMPLES) | {"sc11_sparse_v4_fp8",
                                                          "sc11_sparse_fused"}
    for r in rows:
        assert r.floor_s > 0 and r.time_s >= r.floor_s      # nothing beats the floor
        assert r.time_s == min(r.times.values())
    for r in rows:
        pieces = 2 if formats.get(r.kv).paged else 1         # paged: data row + scale row
        tokens = r.batch * r.s_q * r.keys * pieces * (8 if r.scheme == "heads" else 1)
        if r.indices == "random":      # distinct random slots: hardly ever adjacent
            assert 0.99 * tokens <= r.descriptors <= tokens, r
        else:
            rnd = next(x for x in rows if x.schedule == r.schedule and x.indices == "random")
            if r.scheme == rnd.scheme:     # the same bytes, in fewer descriptors
                assert r.gathered_mb == rnd.gathered_mb
            assert r.descriptors < rnd.descriptors / 4 and r.time_s < rnd.time_s, r
    text = sparse_table(rows)
    assert "| sc11_sparse_ds_mla | random | 2 | 2 | 2048 |" in text and "floor (us)" in text


def test_mlagen_run_cli_reaches_the_sparse_path(tmp_path, monkeypatch, capsys):
    from mlagen.cli import main

    monkeypatch.chdir(tmp_path)
    path = str(SCHEDULES_DIR / "sc11_sparse_two_pools.toml")
    assert main(["run", path, "--batch", "2", "--seqlen", "300", "--s-q", "2"]) == 0
    text = capsys.readouterr().out
    assert "sparse, topk 128 + 512" in text and "outputs match" in text
    assert "gather descriptors" in text


def test_verify_draws_sparse_problems_and_sees_a_fault(tmp_path):
    from mlagen.verify import verify
    from mlagen.verify.runner import replay
    from mlagen.verify.profiles import Bounds

    small = Bounds(max_batch=3, max_len=80, long_len=300, max_extra_table=0)
    s = schedule("sc11_sparse_two_pools")
    r = verify(s, examples=6, profile="ci", progress=False, bounds=small,
               save_failures=False)
    assert r.ok, r.summary()
    bad = verify(schedule("sc11_sparse_two_pools", "sink_sign"), examples=6, profile="ci",
                 progress=False, bounds=small, failures_dir=tmp_path)
    assert not bad.ok and bad.failure.kind == "mismatch", bad.summary()
    assert bad.failure.case.startswith("sparse:")
    # the repro file holds the sparse inputs: replaying it fails the same way
    again = replay(bad.failure.repro_file)
    assert not again.ok and again.failure.kind == "mismatch"


def test_the_fused_operator_takes_the_512_key_shape():
    """The fused operator (dense) with a 448-value latent and 64 RoPE values (RoPE on the
    last 64 of 512), against the oracle."""
    from mlagen.verify.oracle import oracle_for

    s = Schedule.build(target="sc11", heads=16, tp=1, kv_lora_rank=448, rope_dim=64,
                       fused=True, q_lora_rank=256, page_size=64, max_s_q=2, cores=4,
                       block_kv=32, seq_tile=128)
    inp = make_inputs(s.problem, 2, [100, 7], s_q=2, heads=16, seed=1)
    cmp = compare(mlagen.run(s, inp), oracle_for(s)(inp), "bf16")
    assert cmp.ok, cmp.summary()
