"""NaN and Inf in the inputs (docs/conventions.md, "NaN and Inf"): the reference's rule on
its own, the SC11 kernels against it (attention-only and fused, every scheme), and the
verifier's strategies that draw such inputs and causal."""

from __future__ import annotations

import dataclasses
import functools
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlagen import reference
from mlagen.backends import sc11
from mlagen.problem import MlaInputs, MlaOutputs, make_inputs
from mlagen.schedule.records import Schedule
from mlagen.verify.compare import compare
from mlagen.verify.oracle import oracle_for
from mlagen.verify.strategies import NONFINITE, Poison, cases, poison, seen_by_every_row

ATTN = dict(heads=16, tp=2, page_size=16, dtype="bf16", block_kv=16, buffers=2,
            seq_tile=64, cores=4, max_s_q=2)
FUSED = dict(ATTN, fused=True, heads=8, tp=1, q_lora_rank=256, block_kv=32)
SCHEMES = ("heads", "batch", "seq", "batch_seq")


@functools.lru_cache(maxsize=None)
def runner(name: str):
    return sc11.runner(Schedule.build(name=name, target="sc11",
                                      **(FUSED if name == "fused" else ATTN)))


def _inputs(name: str, lens, causal=True, seed=1) -> MlaInputs:
    s = runner(name).schedule
    inp = make_inputs(s.problem, len(lens), lens, s_q=2, heads=s.heads_per_device, seed=seed)
    return dataclasses.replace(inp, causal=causal)


# ------------------------------------------------------------- the reference's rule ----
def _attention(q, k):
    """One sequence, one head: scores of q [1, 1, 1, d] on keys k [n, d]."""
    n, d = k.shape
    cache = k.reshape(1, n, 1, d)          # one page of n slots
    return reference.attention(q, cache, torch.zeros(1, 1, dtype=torch.int32),
                               torch.tensor([n], dtype=torch.int32), dv=4, softmax_scale=1.0,
                               dtype=torch.float64)


@pytest.mark.parametrize("qv,keys,want_out,want_lse", [
    (math.nan, [[1.0, 1.0], [1.0, 2.0]], "nan", "nan"),          # NaN in q
    (1.0, [[math.nan, 1.0], [1.0, 2.0]], "nan", "nan"),          # NaN in a seen key
    (math.inf, [[1.0, 1.0], [1.0, 2.0]], "nan", "nan"),          # +inf scores
    (-math.inf, [[1.0, 1.0], [-1.0, 2.0]], "nan", "nan"),        # a +inf score among them
    (-math.inf, [[1.0, 1.0], [2.0, 2.0]], "zero", "+inf"),       # every score -inf: empty
    (1.0, [[-math.inf, 0.5], [1.0, 2.0]], "finite", "finite"),   # one -inf score: weight 0
])
def test_the_reference_follows_the_rule(qv, keys, want_out, want_lse):
    """Two keys whose last two columns (past dv: scores only) are given; V is ones."""
    k = torch.tensor(keys, dtype=torch.float64)
    k = torch.cat([torch.ones(2, 4, dtype=torch.float64), k], dim=1)        # d = 6, dv = 4
    q = torch.tensor([0.0] * 4 + [qv, 1.0], dtype=torch.float64).reshape(1, 1, 1, 6)
    out, lse = _attention(q, k)
    kinds = {"nan": lambda t: bool(torch.isnan(t).all()),
             "zero": lambda t: bool((t == 0).all()),
             "+inf": lambda t: bool((t == math.inf).all()),
             "finite": lambda t: bool(torch.isfinite(t).all())}
    assert kinds[want_out](out), out
    assert kinds[want_lse](lse), lse
    if want_out == "finite":          # the -inf key weighs nothing: the other key alone
        alone, alone_lse = _attention(q, k[1:])
        assert torch.allclose(out, alone) and torch.allclose(lse, alone_lse)


# ------------------------------------------------------------- the SC11 kernels -------
def test_nan_in_q_comes_back_nan_not_an_empty_row():
    """The case that looked legitimate: out 0 and lse +inf, as if the row had no keys."""
    inp = _inputs("attn", [5, 70, 1])
    inp.q[1, 0, 3, 7] = math.nan
    for scheme in SCHEMES:
        out = runner("attn")(inp, scheme=scheme)
        assert torch.isnan(out.out[1, 0, 3]).all() and torch.isnan(out.lse[1, 3, 0])
        others = torch.ones_like(out.lse, dtype=torch.bool)
        others[1, 3, 0] = False
        assert not torch.isnan(out.lse[others]).any()     # the other rows are untouched


@pytest.mark.parametrize("name", ["attn", "fused"])
@pytest.mark.parametrize("where", ["q", "cache"])
@pytest.mark.parametrize("value", NONFINITE, ids=["nan", "+inf", "-inf"])
@pytest.mark.parametrize("causal", [True, False])
def test_non_finite_inputs_match_the_reference(name, where, value, causal):
    inp = _inputs(name, [5, 70, 1], causal=causal, seed=2)
    s = runner(name).schedule
    col = 7 if where == "q" else 100
    inp = poison(inp, [Poison(where, 0, 1 if where == "q" else 2, 3, col, value),
                       Poison(where, 1, 0, 5, col + 1, value)])
    want = oracle_for(s)(inp, dtype=torch.float64)
    assert not torch.isfinite(want.lse).all()            # the case is not vacuous
    for scheme in SCHEMES:
        cmp = compare(runner(name)(inp, scheme=scheme), want, s.problem.dtype)
        assert cmp.ok, (scheme, cmp.summary())


# ------------------------------------------------------------- the strategies ---------
def test_cases_draw_non_finite_inputs_only_where_asked():
    s = runner("attn").schedule
    seen = {"q": set(), "cache": set()}
    causal = set()

    @settings(max_examples=150, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    @given(cases(s, nonfinite=True, draw_causal=True), cases(s))
    def check(case, plain):
        assert plain.poisons == () and plain.causal is None       # off unless asked
        c = s.problem.causal if case.causal is None else case.causal
        causal.add((c, case.s_q > min(case.seqlens)))
        assert len(case.poisons) <= 2
        for p in case.poisons:
            seen[p.where].add("nan" if math.isnan(p.value) else str(p.value))
            if p.where == "cache":   # only slots every query row sees
                assert p.row < seen_by_every_row(case.seqlens[p.seq], case.s_q, c)
                # +-inf only outside V: a -inf score's 0 * inf is undefined under split-KV
                assert p.col >= s.problem.dv or math.isnan(p.value)
        inp = case.inputs()
        assert inp.causal == c
        for p in case.poisons:
            t = inp.q[p.seq, p.row, p.head, p.col] if p.where == "q" else inp.k_cache[
                inp.block_table[p.seq, p.row // inp.page_size], p.row % inp.page_size, 0, p.col]
            v = float(t)
            assert (math.isnan(v) and math.isnan(p.value)) or v == p.value
    check()
    assert seen == {"q": {"nan", "inf", "-inf"}, "cache": {"nan", "inf", "-inf"}}
    assert (False, True) in causal          # non-causal with s_q > a length: negative rows


def test_verify_draws_non_finite_inputs_and_causal():
    """`mlagen verify` (verify()) takes these draws, not the schedule's causal alone."""
    from mlagen.verify.runner import verify

    s = runner("attn").schedule
    got = []

    def stand_in(inp: MlaInputs, **kw) -> MlaOutputs:
        got.append((inp.causal, not (torch.isfinite(inp.q).all()
                                     and torch.isfinite(inp.k_cache[:, :, :, :]).all())))
        return runner("attn")(inp, **kw)

    r = verify(s, examples=40, runner=stand_in, progress=False, save_failures=False)
    assert r.ok, r.summary()
    assert {c for c, _ in got} == {True, False}
    assert any(nonfinite for _, nonfinite in got)
