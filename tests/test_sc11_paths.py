"""Every SC11 compile-time path the default examples miss, through `mlagen verify`'s own
comparison (the float64 oracle and compare.py's tolerances, NaN-poisoned outputs):

    heads per core other than heads / cores      block_kv smaller than s_q
    pages larger than block_kv (mid-page tiles)  the fused operator with s_q > 1
    more token rows than one projection chunk    a batch larger than the core count
    a softmax scale other than the default       a merge that meets an empty partial

Two small builds cover them; each input is an explicit example of a verify run (plus a few
drawn ones), a check that the run really reached the path, and a fault planted in that
path that verify must catch.  A CI-sized sample of verify drawing the compile-time knobs
themselves closes the file."""

from __future__ import annotations

import dataclasses
import functools

import pytest

from mlagen.backends import sc11
from mlagen.backends.sc11.trace import Engine, Op
from mlagen.schedule.records import Schedule
from mlagen.verify import verify
from mlagen.verify.strategies import Bounds, Case

SMALL = Bounds(max_batch=3, max_len=80, long_len=200, max_extra_table=1)

# attention only: 4 heads a chip on 4 cores but 2 heads a core; block_kv 2 under s_q 4;
# page 16 = 8 blocks, so seq-scheme slices (aligned to block_kv) start mid-page
ATTN = dict(target="sc11", heads=16, tp=4, page_size=16, dtype="bf16", fused=False, cores=4,
            heads_per_core=2, block_kv=2, buffers=2, seq_tile=32, max_s_q=4)
# fused: 8 heads on 8 cores but 2 a core (phases A, C and the heads scheme); s_q 2;
# page 64 over block_kv 16
FUSED = dict(target="sc11", heads=8, tp=1, q_lora_rank=128, page_size=64, dtype="fp16",
             fused=True, cores=8, heads_per_core=2, block_kv=16, buffers=2, seq_tile=64,
             max_s_q=2)
BUILDS = {"attn": ATTN, "fused": FUSED}


@functools.lru_cache(maxsize=None)
def schedule(build: str, fault: str = "none") -> Schedule:
    s = Schedule.build(name=f"paths-{build}", **BUILDS[build])
    return s.with_fault(fault) if fault != "none" else s


def case(build: str, lens, s_q: int, seed: int = 1, scale=None) -> Case:
    s = schedule(build)
    prob = s.problem if scale is None else dataclasses.replace(s.problem, softmax_scale=scale)
    return Case(prob, len(lens), s_q, s.heads_per_device, tuple(lens), seed, False, 0)


def _split_with_empty_row(out, inp):
    return out.extra["n_parts"] > 0


def _mid_page_gathers(out, inp):
    tr = out.extra["trace"]
    g = tr[(tr["engine"] == Engine.SDMA) & (tr["op"] == Op.DMA)]
    # a tile starting mid-page is gathered in more runs than its pages
    page, d = inp.page_size, inp.k_cache.shape[-1]
    return bool((g["aux"] > -(-(g["bytes"] // (d * 2)) // page)).any())


def _cores_projecting(out):
    tr = out.extra["trace"]
    return len(set(tr["core"][(tr["phase"] == 1) & (tr["engine"] == Engine.BDC)].tolist()))


def _two_chunks(out, inp):
    tr = out.extra["trace"]
    # q = q_lora W_UQ: one [rows, 192] product per (chunk, head)
    q = tr[(tr["phase"] == 1) & (tr["op"] == Op.MATMUL) & (tr["n"] == 192)]
    return len(q) == 2 * 8 and int(q["m"].max()) == 128 and int(q["m"].min()) == 2


# input -> (build, explicit case, scheme, check that the run reached the path, fault)
INPUTS = {
    "heads_per_core_not_heads_over_cores": (
        "fused", case("fused", [5, 70, 129], 2), "heads",
        lambda out, inp: _cores_projecting(out) == 4, "default_head_split"),
    "block_kv_below_s_q": (
        "attn", case("attn", [9, 40], 4), "batch",
        lambda out, inp: True, "causal_off_by_one"),
    "page_above_block_kv_mid_page_tiles": (
        "attn", case("attn", [37, 50], 1), "seq", _mid_page_gathers, "page_start_assumed"),
    "fused_s_q_2": (
        "fused", case("fused", [70, 3], 2), "batch_seq",
        lambda out, inp: inp.q_lora.shape[1] == 2, "wrong_scale"),
    "token_rows_over_one_chunk": (
        "fused", case("fused", [(7 * i) % 50 for i in range(65)], 2), "batch", _two_chunks,
        "proj_first_chunk_only"),
    "batch_above_cores": (
        "attn", case("attn", [3, 17, 0, 33, 1, 16, 40], 2), "batch",
        lambda out, inp: inp.batch > 4, "skip_partial_page"),
    "softmax_scale_not_default": (
        "attn", case("attn", [20, 45], 2, scale=0.3), "batch",
        lambda out, inp: abs(inp.softmax_scale - 0.3) < 1e-12, "ignore_softmax_scale"),
    "merge_meets_empty_partial": (
        "attn", case("attn", [8], 4), "seq", _split_with_empty_row, "empty_partial_unmasked"),
}


@functools.lru_cache(maxsize=None)
def runner(build: str):
    return sc11.runner(schedule(build))


@pytest.mark.parametrize("name", sorted(INPUTS))
def test_path_is_verified(name):
    build, c, scheme, reached, _ = INPUTS[name]
    inp = c.inputs()
    assert reached(runner(build)(inp, scheme=scheme), inp), f"{name}: the case misses its path"
    r = verify(schedule(build), examples=3, progress=False, bounds=SMALL,
               explicit=[(c, scheme)], runner=runner(build))
    assert r.ok, r.summary()
    assert r.examples_run >= 2 and r.poisoned


@pytest.mark.parametrize("name", sorted(INPUTS))
def test_fault_in_the_path_is_caught(name):
    from mlagen.errors import EmulatorError

    build, c, scheme, _, fault = INPUTS[name]
    s = schedule(build, fault)
    try:
        r = verify(s, examples=1, progress=False, bounds=SMALL, explicit=[(c, scheme)],
                   save_failures=False)
    except EmulatorError:
        return
    assert not r.ok, f"verify missed {fault} on {name}:\n{r.summary()}"
    assert r.failure.kind in ("mismatch", "error"), r.summary()


def test_the_path_faults_pass_unseen_without_their_path():
    """The path faults are real path faults: the default example's inputs do not reach
    them (which is why these inputs must be drawn)."""
    s = schedule("attn", "ignore_softmax_scale")
    r = verify(s, examples=2, progress=False, bounds=SMALL,
               explicit=[(case("attn", [20, 45], 2), "batch")], save_failures=False)
    assert r.ok, r.summary()


def test_verify_draws_compile_time_knobs():
    """The CI-sized sample of what `mlagen verify --profile explore` does: every example may
    run a different build (one knob changed around the schedule, through the rules)."""
    base = schedule("attn")
    r = verify(base, examples=5, profile="ci", progress=False, bounds=SMALL,
               draw_schedules=True, seed=3)
    assert r.ok, r.summary()
    assert r.variants_built >= 2, r.summary()
    assert any("compile-time knobs drawn" in n for n in r.notes)


def test_backend_path_inputs_run_first(monkeypatch):
    """A backend's verify_paths (inputs for paths the drawn problems never reach; Hopper's
    cluster merge) run as explicit examples before the drawn ones, and the result says so."""
    from mlagen.backends import backend

    lens = (8, 0, 21)
    monkeypatch.setattr(type(backend("sc11")), "verify_paths",
                        lambda self, s, device: [("a test path",
                                                  dict(batch=3, s_q=2, seqlens=lens))])
    seen = []
    inputs = Case.inputs
    monkeypatch.setattr(Case, "inputs", lambda self: (seen.append(self.seqlens),
                                                      inputs(self))[1])
    r = verify(schedule("attn"), examples=2, progress=False, bounds=SMALL)
    assert r.ok, r.summary()
    assert seen[0] == lens and len(seen) >= 2
    assert any(n.startswith("a test path: reached by an explicit input (batch 3")
               for n in r.notes), r.notes
