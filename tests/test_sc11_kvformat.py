"""8-bit KV caches on SC11 (kv_format fp8_e4m3 and fp8_ds_mla): the emulator's result
against the reference on the same quantized cache, the bytes its DMAs move, the BDC's
dequantization in the trace and the cost model, the layout, the input checks, and the
planted dequantization faults that `mlagen verify` must catch."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from mlagen import kvformat
from mlagen.backends import sc11
from mlagen.backends.sc11.costmodel import default_machine, event_costs, simulate
from mlagen.backends.sc11.resources import sc11_layout
from mlagen.backends.sc11.trace import Engine, Mem, Op
from mlagen.errors import InputError, MlagenError
from mlagen.problem import make_inputs
from mlagen.schedule.records import Schedule
from mlagen.schedule.rules import check
from mlagen.verify import verify
from mlagen.verify.strategies import Bounds, Case

SMALL = Bounds(max_batch=3, max_len=80, long_len=200, max_extra_table=1)

ATTN = dict(target="sc11", heads=4, tp=1, page_size=16, dtype="bf16", fused=False, cores=4,
            block_kv=16, buffers=2, seq_tile=32, max_s_q=2)
FUSED = dict(target="sc11", heads=8, tp=1, q_lora_rank=128, page_size=16, dtype="bf16",
             fused=True, cores=4, block_kv=16, buffers=2, seq_tile=32, max_s_q=2)
BUILDS = {"attn_e4m3": dict(ATTN, kv_format="fp8_e4m3"),
          "fused_e4m3": dict(FUSED, kv_format="fp8_e4m3"),
          "fused_ds": dict(FUSED, kv_format="fp8_ds_mla")}


@functools.lru_cache(maxsize=None)
def schedule(build: str, fault: str = "none") -> Schedule:
    s = Schedule.build(name=f"kv-{build}", **BUILDS[build])
    return s.with_fault(fault) if fault != "none" else s


@functools.lru_cache(maxsize=None)
def runner(build: str):
    return sc11.runner(schedule(build))


def case(build: str, lens, s_q: int = 2, seed: int = 1, edges: bool = True,
         per_seq: bool = False) -> Case:
    s = schedule(build)
    return Case(s.problem, len(lens), s_q, s.heads_per_device, tuple(lens), seed, False, 0,
                kv_edges=edges, descale_per_seq=per_seq)


def test_the_format_is_a_compile_time_field():
    names = {b: schedule(b).variant_name() for b in BUILDS}
    assert "kvfp8e4m3" in names["attn_e4m3"] and "kvfp8dsmla" in names["fused_ds"]
    plain = Schedule.build(name="plain", **FUSED)
    assert "kv" not in plain.variant_name().split("_")[3]       # bf16 names are unchanged
    assert len({plain.variant_name(), names["fused_e4m3"], names["fused_ds"]}) == 3
    files = {b: sc11.render(schedule(b)).files["kernel.cpp"] for b in ("fused_e4m3", "fused_ds")}
    assert "KV_FORMAT = sc11::KV_E4M3" in files["fused_e4m3"]
    assert "KV_BYTES = 576;" in files["fused_e4m3"] and "KV_BYTES = 656;" in files["fused_ds"]


@pytest.mark.parametrize("build,scheme,per_seq", [
    ("attn_e4m3", "batch", False), ("attn_e4m3", "seq", True),
    ("fused_e4m3", "batch_seq", True), ("fused_ds", "seq", False), ("fused_ds", "heads", False)])
def test_verify_passes_on_quantized_caches(build, scheme, per_seq):
    """The reference on the same quantized cache (dequantized exactly), through verify's
    oracle and tolerances: explicit cases with the quantizer's edge tiles and lengths that
    cross tiles and pages, then drawn ones (the format's edges and descales drawn too)."""
    c = case(build, [70, 0, 33], per_seq=per_seq)
    inp = c.inputs()
    assert inp.k_cache.dtype == kvformat.FP8 and inp.kv == schedule(build).problem.kv
    if per_seq:
        assert inp.k_descale.shape == (3,)
    r = verify(schedule(build), examples=3, progress=False, bounds=SMALL,
               explicit=[(c, scheme)], runner=runner(build))
    assert r.ok, r.summary()
    assert r.examples_run >= 2


def test_descale_is_applied_once_and_per_sequence():
    """Scaling one sequence's descale scales its keys and values: its lse and output move,
    the other sequence's do not (the descale is per sequence and really read)."""
    inp = case("attn_e4m3", [40, 25], per_seq=True).inputs()
    a = runner("attn_e4m3")(inp, scheme="batch")
    ds = inp.k_descale.clone()
    ds[1] *= 2
    b = runner("attn_e4m3")(type(inp)(**{**inp.__dict__, "k_descale": ds}), scheme="batch")
    torch.testing.assert_close(a.out[0], b.out[0], atol=0, rtol=0)
    assert (a.out[1].float() - b.out[1].float()).abs().max() > 0.1
    assert not torch.equal(a.lse[1], b.lse[1])


def test_dmas_move_the_formats_bytes_and_the_bdc_dequantizes():
    """SDMA gathers and the GDMA tile loads carry the format's bytes a token (576 for
    fp8_e4m3: half of bf16's 1152; 656 for fp8_ds_mla); each block gets one DEQUANT event
    before its Q K^T, and the cost model charges it from the target's conversion rate."""
    lens = [70, 0, 33]
    mc = default_machine()
    for build, token in (("fused_e4m3", 576), ("fused_ds", 656)):
        inp = case(build, lens).inputs()
        tr = runner(build).dry_run(inp, "batch")
        gather = tr[(tr["engine"] == Engine.SDMA) & (tr["op"] == Op.DMA)]
        assert int(gather["bytes"].sum()) == sum(lens) * token
        g = tr[(tr["engine"] == Engine.GDMA) & (tr["src"] == Mem.L2) & (tr["dst"] == Mem.LMEM)]
        fed = np.isin(g["deps"], gather["id"]).any(axis=1)     # tile loads wait for a gather
        loads = g[fed]
        assert int(loads["bytes"].sum()) == sum(lens) * token
        deq = tr[tr["op"] == Op.DEQUANT]
        blocks = sum(-(-n // 16) for n in lens)          # block_kv 16, tiles of 32
        assert len(deq) == blocks and (deq["engine"] == Engine.BDC).all()
        assert int(deq["n"].sum()) == sum(lens) * 576
        per_value = 1 if build == "fused_e4m3" else (2 * 512 + 64) / 576
        assert int(deq["elems"].sum()) == round(sum(lens) * 576 * per_value)
        fixed, _, _ = event_costs(deq, mc)
        want = (np.ceil(deq["elems"] / (mc.lanes * mc.dequant_per_lane)) + mc.issue) / mc.bdc_hz
        np.testing.assert_allclose(fixed, want)
        sim = simulate(tr)
        assert sim.total_s > 0


@pytest.mark.parametrize("scheme", ["batch", "seq"])
def test_happens_before_holds_with_the_dequantization(scheme):
    """The multi-buffer protocol and every phase's order, checked from the trace, with each
    step's first BDC event its block's dequantization (it waits for the tile load)."""
    from mlagen.backends.sc11 import tracecheck

    for build in ("attn_e4m3", "fused_ds"):
        s = schedule(build)
        tr = runner(build).dry_run(case(build, [70, 0, 33]).inputs(), scheme)
        assert tracecheck.check(tr, s.mapping.buffers, s.problem.d) == []
        st = tracecheck.phase_b_steps(tr, 0, s.problem.d * 2)
        ops = {int(e["id"]): int(e["op"]) for e in tr}
        assert st.bdc_first and all(ops[i] == Op.DEQUANT for i in st.bdc_first)


def test_the_timeline_shows_the_dequantization(tmp_path):
    from mlagen.backends.sc11.timeline import _labels, text_summary

    tr = runner("fused_ds").dry_run(case("fused_ds", [70, 33]).inputs(), "batch")
    sim = simulate(tr)
    assert "dequant" in _labels(sim, "op")
    text = text_summary(sim)
    assert "BDC dequantization" in text and "SDMA gathers" in text
    assert f"{(70 + 33) * 656 / 1e6:.2f} MB" in text


@pytest.mark.parametrize("build", ["attn_e4m3", "fused_ds"])
def test_layout_matches_the_emulators_allocations(build):
    s = schedule(build)
    lay = sc11_layout(s, check(s).target)
    out = runner(build)(case(build, [70, 0, 33]).inputs(), scheme="batch")
    assert out.extra["l2_static"] == lay["l2"]
    assert out.extra["lmem_high"] == lay["lmem"]
    token = kvformat.get(s.problem.kv).token_bytes()
    assert lay["l2"] == 4 * 2 * -(-32 * token // 256) * 256     # cores x buffers x tile


def test_inputs_in_the_wrong_format_are_refused():
    r = runner("attn_e4m3")
    inp = case("attn_e4m3", [20]).inputs()
    plain = make_inputs(Schedule.build(name="p", **ATTN).problem, 1, [20], s_q=1, heads=4)
    with pytest.raises(InputError, match="float8_e4m3fn"):
        r(type(plain)(**{**plain.__dict__, "kv_format": ""}))
    with pytest.raises(InputError, match="needs k_descale"):
        r(type(inp)(**{**inp.__dict__, "k_descale": None}))
    with pytest.raises(InputError, match=r"fp32 \[1\] or \[1\]"):
        r(type(inp)(**{**inp.__dict__, "k_descale": torch.ones(2)}))
    with pytest.raises(InputError, match="finite and > 0"):
        r(type(inp)(**{**inp.__dict__, "k_descale": torch.zeros(1)}))
    ds = case("fused_ds", [20]).inputs()
    with pytest.raises(InputError, match="takes none"):
        runner("fused_ds")(type(ds)(**{**ds.__dict__, "k_descale": torch.ones(1)}))


# the dequantization faults, each with the input that shows it
FAULTS = {
    ("attn_e4m3", "kv_scale_twice"): case("attn_e4m3", [40, 25], edges=False),
    ("fused_ds", "kv_scale_twice"): case("fused_ds", [40, 25], edges=False),
    ("fused_ds", "kv_scale_wrong_tile"): case("fused_ds", [40, 25]),
}


@pytest.mark.parametrize("build,fault", sorted(FAULTS))
def test_dequantization_faults_are_caught(build, fault):
    r = verify(schedule(build, fault), examples=1, progress=False, bounds=SMALL,
               explicit=[(FAULTS[(build, fault)], "batch")], save_failures=False)
    assert not r.ok, f"verify missed {fault} on {build}:\n{r.summary()}"
    assert r.failure.kind == "mismatch", r.summary()


def test_the_wrong_tile_fault_needs_tiles_of_different_scales():
    """Why the strategies draw the quantizer's edge tiles: on plain random data nearly
    every tile's scale is the same power of two, so a scale from the wrong tile is seen
    only where the scales differ (the edge tiles: all-zero, amax 448 x 2^-7 and above)."""
    plain = case("fused_ds", [40, 25], edges=False).inputs()
    edged = case("fused_ds", [40, 25]).inputs()

    def distinct(inp):
        raw = inp.k_cache.view(torch.uint8).reshape(-1, 656)
        sc = raw[:, 512:528].contiguous().view(torch.float32)
        ok = torch.isfinite(sc).all(dim=1)
        return (sc[ok] != sc[ok][:, :1]).any(dim=1).float().mean().item()

    assert distinct(edged) > distinct(plain)


def test_bench_compares_the_formats_at_one_point():
    from mlagen.backends.sc11.bench import (formats_table, kv_formats_of, seed_point,
                                            with_kv_format)

    base = Schedule.build(name="b", **FUSED)
    assert kv_formats_of(base, None) == ["bf16", "fp8_e4m3"]
    assert kv_formats_of(base, "fp8_ds_mla, bf16") == ["fp8_ds_mla", "bf16"]
    with pytest.raises(MlagenError, match="not one of"):
        with_kv_format(base, "fp4")
    with pytest.raises(MlagenError, match="needs dtype"):
        with_kv_format(base.replace(dtype="fp16"), "fp8_ds_mla")
    seeds = [seed_point(with_kv_format(base, f), batch=8, seqlen=256)
             for f in ("bf16", "fp8_e4m3")]
    table = formats_table(seeds)
    rows = [r.split(" | ") for r in table.splitlines()[2:]]
    assert rows[0][0] == "| bf16" and rows[1][0] == "| fp8_e4m3"
    assert float(rows[1][7]) == pytest.approx(float(rows[0][7]) / 2, rel=1e-3)   # SDMA MB
    assert seeds[1].double < seeds[0].double          # half the KV bytes: faster


def test_bench_kv_format_option(capsys):
    """`mlagen bench --kv-format`: a bad name is one line and exit 2, on either target, before
    anything else (no GPU needed); a good one on hopper then meets the device check."""
    from mlagen.cli import main

    assert main(["bench", "--target", "sc11", "--kv-format", "fp4", "--quick"]) == 2
    assert "fp4" in capsys.readouterr().err
    assert main(["bench", "--target", "hopper", "--kv-format", "bf16,fp4"]) == 2
    assert "--kv-format 'fp4': the hopper kernels read bf16" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert main(["bench", "--target", "hopper", "--kv-format", "fp8_e4m3"]) == 2
        assert "needs an NVIDIA sm_90 GPU" in capsys.readouterr().err
