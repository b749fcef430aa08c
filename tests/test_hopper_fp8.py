"""8-bit KV caches on Hopper without a GPU: the schedule rules (file:line refusals), the
variant names, the rendered kernels (nvcc compile, ptxas: no spill, setmaxnreg honoured,
wgmmas not serialized), the shared-memory model against the kernel's constants, the planted
dequantization faults, and the bit placement the converter uses (mla_fp8.cuh) checked on
all 256 e4m3 codes."""

from __future__ import annotations

import re

import pytest
import torch

from mlagen.errors import ScheduleError
from mlagen.schedule import loads
from mlagen.schedule.records import Schedule

ROWS = dict(target="hopper", mainloop="wgmma", block_kv=64, buffers=2, warps=4)
KV_CODE = {"fp8_e4m3": 1, "fp8_ds_mla": 2}


def fp8(kv="fp8_e4m3", rows=16, **kw):
    return Schedule.build(**dict(ROWS, **kw), rows_per_tile=rows, kv_format=kv)


def _render(s):
    from mlagen.backends.hopper import render
    return render(s)


# ---------------------------------------------------------------- rules (CPU) -----

BASE = """
[problem]
heads = 16
page_size = {page}
dtype = "{dtype}"
kv_format = "{kv}"

[target]
kind = "hopper"

[schedule]
block_kv = 64
buffers = 2
rows_per_tile = {rows}
warps = {warps}
mainloop = "{mainloop}"
fp8_mma = "{mma}"
{extra}
"""


def _toml(**kw):
    v = dict(page=64, dtype="bf16", kv="fp8_e4m3", rows=16, warps=4, mainloop="wgmma",
             mma="dequant", extra="")
    v.update(kw)
    return BASE.format(**v)


@pytest.mark.parametrize("kw,line,words", [
    (dict(page=32), 4, "page_size = 32"),
    (dict(page=16, kv="fp8_ds_mla"), 4, "multiple of 64"),
    (dict(warps=8), 15, "one consumer warpgroup"),
    (dict(rows=64, warps=8, extra="fp8_raw_slots = 3"), 18, "rows_per_tile = 64 converts"),
    (dict(rows=64, warps=8, extra="fp8_converters = 2"), 18, "fp8_converters = 2: rows_per"),
    (dict(rows=64, warps=4), 15, "warps = 4"),
    (dict(rows=64, warps=8, mma="mma", extra="fp8_converters = 0"), 17, "64 rows"),
    (dict(mainloop="mma_sync", warps=8), 16, "is read by the wgmma kernels"),
    (dict(mma="mma"), 17, "is built for dense fp8_e4m3 caches with rows_per_tile = 16 and "
                          "fp8_converters = 0 (this schedule: fp8_e4m3, dense, 16 rows, 1 "
                          "converters)"),
    (dict(mma="mma", rows=32, extra="fp8_converters = 0"), 17, "32 rows, 0 converters"),
    (dict(mma="int4"), 17, "must be one of dequant, mma"),
    (dict(kv="fp8_ds_mla", dtype="fp16"), 5, "RoPE values in bf16"),
    (dict(kv="fp8_e4m3", extra="fp8_converters = 3"), 18, "must be 0 (the consumer"),
    (dict(kv="fp8_ds_mla", extra="fp8_converters = 0"), 18, "reads dense fp8_e4m3"),
    (dict(rows=32, extra="fp8_converters = 0"), 18, "rows_per_tile = 16"),
    (dict(extra="fp8_converters = 0\nfp8_raw_slots = 6"), 19, "must be 2..5"),
    (dict(kv="", dtype="bf16", extra="fp8_converters = 2"), 18, "for 8-bit kv_formats"),
    (dict(kv="fp8_ds_mla", rows=32, extra="fp8_raw_slots = 3"), 18, "7 slots fit"),
    (dict(extra="fp8_raw_slots = 4"), 18, "must be 2..3 with fp8_converters = 1"),
])
def test_rules_refuse_with_file_and_line(kw, line, words):
    with pytest.raises(ScheduleError) as e:
        loads(_toml(**kw), source="fp8.toml")
    msg = str(e.value)
    assert words in msg, msg
    assert e.value.line == line, (e.value.line, msg)
    assert "\n" not in msg


def test_rules_accept_both_formats_and_fp16_e4m3():
    for kv, dtype, rows in (("fp8_e4m3", "bf16", 16), ("fp8_ds_mla", "bf16", 32),
                            ("fp8_e4m3", "fp16", 32)):
        s = loads(_toml(kv=kv, dtype=dtype, rows=rows), source="ok.toml")
        assert s.problem.kv == kv


def test_rules_accept_64_row_tiles_at_any_page_size():
    """The 64-row kernel gathers dense 8-bit keys by the block table (any page size); the
    few-rows kernel's TMA boxes still need pages of 64."""
    for kv, dtype, page in (("fp8_e4m3", "bf16", 16), ("fp8_ds_mla", "bf16", 1),
                            ("fp8_e4m3", "fp16", 32), ("fp8_ds_mla", "bf16", 128)):
        s = loads(_toml(kv=kv, dtype=dtype, rows=64, warps=8, page=page), source="ok.toml")
        assert s.variant_name().endswith("_r64_w8_wgmma_fp8dequant_fp8cv1_fp8raw2")


def test_render_passes_the_format_to_the_64_row_kernel_without_the_cluster_merge():
    for kv, code in KV_CODE.items():
        src = _render(fp8(kv, 64, warps=8)).files["split.cu"]
        flat = re.sub(r"\s+", " ", src)
        assert f"launch_split_wgmma_impl<__nv_bfloat16, kFault, 0, {code}>" in flat
        assert "int split_cluster(int, int) { return 1; }" in flat
    flat = re.sub(r"\s+", " ", _render(Schedule.build(**dict(ROWS, warps=8), rows_per_tile=64))
                  .files["split.cu"])
    assert "launch_split_wgmma_impl<__nv_bfloat16, kFault>" in flat
    assert "split_wgmma_cluster<__nv_bfloat16, kFault>(batch, num_parts)" in flat


def test_rules_accept_register_conversion_with_one_or_two_consumer_warpgroups():
    for warps, raw in ((4, 2), (8, 4), (8, 5)):
        s = loads(_toml(warps=warps, extra=f"fp8_converters = 0\nfp8_raw_slots = {raw}"),
                  source="ok.toml")
        assert (s.mapping.fp8_converters, s.mapping.warps) == (0, warps)
        assert s.variant_name().endswith(f"_w{warps}_wgmma_fp8dequant_fp8cv0_fp8raw{raw}")


def test_rules_accept_e4m3_mmas_on_the_register_path():
    for warps in (4, 8):
        s = loads(_toml(warps=warps, mma="mma",
                        extra="fp8_converters = 0\nfp8_raw_slots = 4"), source="ok.toml")
        assert s.variant_name().endswith(f"_w{warps}_wgmma_fp8mma_fp8cv0_fp8raw4")


def test_render_passes_mm_to_the_rows_kernel_only_in_mma_mode():
    mma = Schedule.build(**ROWS, rows_per_tile=16, kv_format="fp8_e4m3", fp8_converters=0,
                         fp8_raw_slots=4, fp8_mma="mma")
    flat = re.sub(r"\s+", " ", _render(mma).files["split.cu"])
    assert "launch_split_wgmma_rows_impl<__nv_bfloat16, 16, 1, kFault, 1, 0, 4, 0, 1>" in flat
    deq = Schedule.build(**ROWS, rows_per_tile=16, kv_format="fp8_e4m3", fp8_converters=0,
                         fp8_raw_slots=4)
    flat = re.sub(r"\s+", " ", _render(deq).files["split.cu"])
    assert "launch_split_wgmma_rows_impl<__nv_bfloat16, 16, 1, kFault, 1, 0, 4>" in flat


def test_mma_mode_rounds_the_reference_at_its_e4m3_points():
    from mlagen.backends import backend
    mma = Schedule.build(**ROWS, rows_per_tile=16, kv_format="fp8_e4m3", fp8_converters=0,
                         fp8_raw_slots=4, fp8_mma="mma")
    assert backend("hopper").rounded_for(mma) == ("q_e4m3", "p_e4m3")
    assert backend("hopper").rounded_for(fp8("fp8_e4m3")) == ("p",)


def test_variant_names_carry_the_format_and_16_bit_names_do_not_change():
    bf = Schedule.build(**ROWS, rows_per_tile=16)
    assert bf.variant_name() == "hopper_bf16_bkv64_buf2_r16_w4_wgmma"
    names = {fp8(kv).variant_name() for kv in KV_CODE}
    assert names == {"hopper_bf16_fp8e4m3_bkv64_buf2_r16_w4_wgmma_fp8dequant_fp8cv1_fp8raw2",
                     "hopper_bf16_fp8dsmla_bkv64_buf2_r16_w4_wgmma_fp8dequant_fp8cv1_fp8raw2"}


def test_render_passes_the_format_to_the_rows_kernel():
    assert "kFault>" in re.sub(r"\s+", " ", _render(Schedule.build(**ROWS, rows_per_tile=16))
                               .files["split.cu"])
    for kv, code in KV_CODE.items():
        src = _render(fp8(kv))
        flat = re.sub(r"\s+", " ", src.files["split.cu"])
        assert f"launch_split_wgmma_rows_impl<__nv_bfloat16, 16, 1, kFault, {code}>" in flat
        assert f"int mlagen_hopper_kv_format() {{ return {code}; }}" in src.files["api.cu"]


@pytest.mark.parametrize("kv,fault", [("fp8_e4m3", "kv_scale_wrong_tile"),
                                      ("fp8_ds_mla", "descale_not_in_output")])
def test_render_refuses_a_fault_the_format_has_no_path_for(kv, fault):
    with pytest.raises(ValueError, match=f"not planted in the {kv} path"):
        _render(fp8(kv).with_fault(fault))
    with pytest.raises(ValueError, match="not planted"):
        _render(Schedule.build(**ROWS, rows_per_tile=16).with_fault(fault))


def test_fp8_mma_is_in_the_tuning_space():
    from mlagen.backends import backend
    assert backend("hopper").tuning_space()["fp8_mma"] == ("dequant",)
    assert backend("hopper").tuning_space()["fp8_converters"] == (1, 2)
    assert backend("hopper").tuning_space()["fp8_raw_slots"] == (2, 3)


def test_example_schedules_reach_both_formats():
    from pathlib import Path

    from mlagen.paths import SCHEDULES_DIR
    from mlagen.schedule import load

    kvs = {load(p).problem.kv for p in Path(SCHEDULES_DIR).glob("hopper_fp8_*.toml")}
    assert kvs == {"fp8_e4m3", "fp8_ds_mla"}


# ------------------------------------------ the converter's arithmetic (CPU mirror) -----

def _placed(code: int) -> int:
    """mla_fp8.cuh e4m3x4_placed, then e4m3_nan_halves, for one byte: sign to bit 15, the
    7 low bits to 4..10, and a bf16 NaN ORed over e4m3's NaN (S.1111.111)."""
    nan = 0x7FC0 if ((code & 0x7F) + 1) & 0x80 else 0
    return ((code & 0x80) << 8) | ((code & 0x7F) << 4) | nan


def test_bit_placement_times_2_to_120_is_every_e4m3_value_exactly():
    codes = torch.arange(256, dtype=torch.int32)
    want = codes.to(torch.uint8).view(torch.float8_e4m3fn).double()
    bits = torch.tensor([_placed(int(c)) for c in codes], dtype=torch.int32)
    placed = bits.to(torch.int16).view(torch.bfloat16).double()
    got = placed * 2.0 ** 120
    finite = ~torch.isnan(want)
    assert int(finite.sum()) == 254
    assert torch.equal(got[finite], want[finite])
    # a subnormal e4m3 (exponent field 0) is a subnormal bf16: exact as well
    assert float(got[1]) == 2.0 ** -9
    # e4m3's NaN (S.1111.111), both signs, is a bf16 NaN: and only it
    assert torch.equal(torch.isnan(got), ~finite)


def _byte_perm(x, y, s):
    """prmt.b32's default mode: selector nibble i picks byte (s_i & 7) of y:x, and with
    s_i & 8 replicates that byte's sign bit over the result byte."""
    b = [(x >> (8 * i)) & 0xFF for i in range(4)] + [(y >> (8 * i)) & 0xFF for i in range(4)]
    out = 0
    for i in range(4):
        n = (s >> (4 * i)) & 0xF
        v = b[n & 7]
        out |= ((0xFF if v & 0x80 else 0) if n & 8 else v) << (8 * i)
    return out


def test_bit_placement_of_four_bytes_matches_byte_perm_order():
    """The u32 form: bytes b0..b3 (little-endian, b0 the first column) to (lo, hi) =
    (b1:b0, b3:b2) as bf16x2 words, the low half the first column; NaN bytes at each place."""
    words = [0x8A017F38, 0x7F00FF01, 0xFF7F7E80, 0x00000000, 0x7F7F7F7F, 0xFFFFFFFF]
    words += [c * 0x01010101 for c in range(256)] + [0x80 << (8 * i) for i in range(4)]
    for w in words:
        nan = (w & 0x7F7F7F7F) + 0x01010101
        lo = (((_byte_perm(w, 0, 0x9180) << 4) & 0x87F087F0)
              | (_byte_perm(nan, 0, 0x9988) & 0x7FC07FC0))
        hi = (((_byte_perm(w, 0, 0xB3A2) << 4) & 0x87F087F0)
              | (_byte_perm(nan, 0, 0xBBAA) & 0x7FC07FC0))
        b = [(w >> (8 * i)) & 0xFF for i in range(4)]
        assert lo == _placed(b[0]) | (_placed(b[1]) << 16), hex(w)
        assert hi == _placed(b[2]) | (_placed(b[3]) << 16), hex(w)


# ----------------------------------------------------------------- nvcc -----

def _header_constant(tmp_path, expr):
    from test_hopper_compile import _header_constant as hc
    return hc(tmp_path, "mla_wgmma_rows.cuh", expr)


@pytest.mark.nvcc
def test_smem_model_matches_the_register_conversion_kernel(tmp_path):
    """fp8_converters = 0: no bf16 ring, the raw slots beside Q and P^T (kSmem as modelled)."""
    from mlagen.backends.hopper.resources import hopper_smem

    for raw in (2, 5):
        cfg = f"mlagen::hopper::WgmmaRowsConfig<16, 1, {KV_CODE['fp8_e4m3']}, 0, {raw}>"
        sm = hopper_smem(fp8("fp8_e4m3", 16, fp8_converters=0, fp8_raw_slots=raw))
        assert sm["total"] == _header_constant(tmp_path, cfg + "::kSmem")
        assert sm["slots"] == 0 == _header_constant(tmp_path, cfg + "::kSlots")


@pytest.mark.parametrize("rows,raw", [(16, 2), (32, 2), (16, 3)])
@pytest.mark.parametrize("kv", sorted(KV_CODE))
def test_smem_model_matches_the_fp8_kernel(rows, raw, kv, tmp_path):
    """resources.hopper_smem == WgmmaRowsConfig<N, 1, KV, 1, RS>::kSmem, and the bf16 ring
    the model counts is the kernel's kSlots."""
    from mlagen.backends.hopper.resources import hopper_smem

    cfg = f"mlagen::hopper::WgmmaRowsConfig<{rows}, 1, {KV_CODE[kv]}, 1, {raw}>"
    sm = hopper_smem(fp8(kv, rows, fp8_raw_slots=raw))
    assert sm["total"] == _header_constant(tmp_path, cfg + "::kSmem")
    slots = _header_constant(tmp_path, cfg + "::kSlots")
    assert slots == sm["slots"] == {(16, 2, "fp8_e4m3"): 16, (16, 2, "fp8_ds_mla"): 15,
                                    (32, 2, "fp8_e4m3"): 14, (32, 2, "fp8_ds_mla"): 12,
                                    (16, 3, "fp8_e4m3"): 12,
                                    (16, 3, "fp8_ds_mla"): 10}[rows, raw, kv]


def _ptxas(src, tmp_path):
    from test_hopper_compile import _ptxas_split
    return _ptxas_split(src, tmp_path)


@pytest.mark.nvcc
@pytest.mark.parametrize("kv,rows,dtype,cv", [("fp8_e4m3", 16, "bf16", 1),
                                              ("fp8_e4m3", 32, "bf16", 1),
                                              ("fp8_ds_mla", 16, "bf16", 1),
                                              ("fp8_ds_mla", 32, "bf16", 1),
                                              ("fp8_e4m3", 16, "fp16", 1),
                                              ("fp8_e4m3", 32, "bf16", 2),
                                              ("fp8_ds_mla", 16, "bf16", 2),
                                              ("fp8_e4m3", 16, "bf16", 3),
                                              ("fp8_e4m3", 16, "bf16", 0),
                                              ("fp8_e4m3", 16, "fp16", 0)])
def test_fp8_kernels_compile_without_spills(kv, rows, dtype, cv, tmp_path):
    """Consumer, converter(s) and producer warpgroups: setmaxnreg honoured (no C7508), no
    spill, no local memory, the wgmmas neither serialized nor fenced one by one.  cv 3:
    one converter warpgroup and three raw slots; cv 0: the consumer converts in registers
    (four raw slots), its A fragments' wgmmas not serialized either."""
    conv, raw = {3: (1, 3), 0: (0, 4)}.get(cv, (cv, 2))
    src = _render(fp8(kv, rows, dtype=dtype, fp8_converters=conv, fp8_raw_slots=raw))
    flat = re.sub(r"\s+", " ", src.files["split.cu"])
    tail = f", {conv}, {raw}" if (conv, raw) != (1, 2) else ""
    assert f"kFault, {KV_CODE[kv]}{tail}>" in flat
    log = _ptxas(src, tmp_path)
    assert "mla_split_wgmma_rows_kernel" in log
    assert "C7508" not in log, log
    spills = [int(n) for n in re.findall(r"(\d+) bytes spill stores", log)]
    assert spills and max(spills) == 0, log
    frames = [int(n) for n in re.findall(r"(\d+) bytes stack frame", log)]
    assert frames and max(frames) == 0, log
    assert "serialized" not in log and "C7517" not in log and "C7519" not in log, log


@pytest.mark.nvcc
@pytest.mark.parametrize("kv,fault", [("fp8_ds_mla", "kv_scale_wrong_tile"),
                                      ("fp8_ds_mla", "kv_scale_twice"),
                                      ("fp8_e4m3", "kv_scale_twice"),
                                      ("fp8_e4m3", "descale_not_in_output")])
def test_dequantization_faults_render_and_compile(kv, fault, tmp_path):
    from mlagen.backends.hopper import FAULT_CODE

    src = _render(fp8(kv).with_fault(fault))
    assert f"#define MLAGEN_FAULT {FAULT_CODE[fault]}" in src.files["split.cu"]
    assert "mla_split_wgmma_rows_kernel" in _ptxas(src, tmp_path)


def test_bench_times_each_shape_in_each_format_and_reports_the_speedup():
    from mlagen.backends.hopper.bench import Report, kv_speedups, plan_rows
    from mlagen.backends.hopper.shapes import parse_shape

    rows = plan_rows(shapes=[parse_shape("32,1,4096,16")], kv_formats=("", "fp8_e4m3"))
    assert [(r.b, r.kv) for r in rows] == [(32, ""), (32, "fp8_e4m3")]
    assert rows[1].label().endswith("fp8_e4m3")
    rows[0].eager_ms, rows[1].eager_ms = 0.09, 0.05
    rows[0].step_us, rows[1].step_us = 90.0, 45.0
    rep = Report(device="x", torch="t", commit="c", mlagen="m", command="cmd", rows=rows)
    lines = kv_speedups(rep)
    assert any("eager 1.80x" in x and "step 2.00x" in x and "kernels -x" in x for x in lines)


def test_bench_refuses_an_unread_format(capsys):
    from mlagen.cli import main

    assert main(["bench", "--target", "hopper", "--shape", "1,1,64,16",
                 "--kv-format", "fp8_ue8m0_paged"]) == 2
    assert "--kv-format 'fp8_ue8m0_paged'" in capsys.readouterr().err


@pytest.mark.parametrize("kv", sorted(KV_CODE))
def test_verify_oracle_reads_8_bit_caches_as_their_values(kv):
    """verify's oracle (its P-rounding allowance) on an 8-bit cache equals the oracle on a
    float cache of the dequantized values (fp8_ds_mla's are exact in bf16: the same slack)."""
    import dataclasses

    from mlagen import kvformat
    from mlagen.schedule import load
    from mlagen.paths import SCHEDULES_DIR
    from mlagen.verify.oracle import oracle_for
    from mlagen.verify.strategies import Case

    s = load(SCHEDULES_DIR / f"hopper_{kv}.toml")
    inp = Case(s.problem, 2, 1, 16, (1, 300), 0, False, 0).inputs()
    got = oracle_for(s)(inp, dtype=torch.float64)
    vals = kvformat.dequantize(inp.k_cache, kv, None, dtype=torch.float64)
    if inp.k_descale is not None:
        vals = vals * float(inp.k_descale[0])      # one descale for the cache
    plain = dataclasses.replace(inp, k_cache=vals, kv_format="", k_descale=None)
    plain.kv_format = "bf16"        # the values are read as they are (float64)
    want = oracle_for(s)(plain, dtype=torch.float64)
    assert torch.allclose(got.out, want.out) and torch.allclose(got.lse, want.lse)
    assert torch.allclose(got.extra["slack"]["out"], want.extra["slack"]["out"])


def test_fp8_defaults_convert_in_registers_at_large_batches():
    """fp8_e4m3 up to 16 rows at batch >= FP8_REGS_BATCH: two consumer warpgroups converting
    in registers; below it, or beyond 16 rows, or for fp8_ds_mla, the converter kernel;
    beyond 32 rows, or on pages not a multiple of 64, the 64-row kernel."""
    from mlagen.backends.hopper import defaults

    for rows, page, want in ((16, 64, 16), (32, 64, 32), (33, 64, 64), (256, 64, 64),
                             (16, 16, 64), (32, 96, 64)):
        for kv in KV_CODE:
            m = defaults.default_schedule(rows, batch=4, page_size=page, kv=kv).mapping
            assert m.rows_per_tile == want, (rows, page, kv, m.rows_per_tile)
            assert m.warps == (8 if want == 64 else 4)

    big = defaults.default_schedule(16, batch=defaults.FP8_REGS_BATCH, kv="fp8_e4m3").mapping
    assert (big.fp8_converters, big.warps, big.fp8_raw_slots) == (0, 8, 4)
    for rows, batch, kv in ((16, defaults.FP8_REGS_BATCH - 1, "fp8_e4m3"),
                            (32, 128, "fp8_e4m3"), (16, 128, "fp8_ds_mla")):
        m = defaults.default_schedule(rows, batch=batch, kv=kv).mapping
        assert (m.fp8_converters, m.warps) == (1, 4), (rows, batch, kv)


def test_metadata_caps_parts_where_8_bit_row_tiles_pair_up(monkeypatch):
    """Row tiles in pairs run as clusters of 2 (the crossover): the metadata's parts are
    capped so that every part's clusters fit at once (a part more is a second wave); an odd
    tile count, or a bf16 cache, takes one CTA an SM's parts."""
    from mlagen.backends.hopper import api

    monkeypatch.setattr(api, "_resolve", lambda *a: ("key", 64, 0, 5))
    monkeypatch.setattr(api.ops, "sm_count", lambda device: 132)

    class Lib:
        def ctas_per_sm(self):
            return 1

        def cluster_parts(self, parts):   # 60 clusters of 2 fit at once
            return min(parts, 60)
    monkeypatch.setattr(api.ops, "get", lambda key: Lib())
    lens = torch.zeros(4, dtype=torch.int32)
    for kv, rows, parts in (("fp8_e4m3", 128, 60), ("fp8_ds_mla", 256, 30),
                            ("fp8_e4m3", 192, 44), ("fp8_e4m3", 64, 132), ("bf16", 128, 66)):
        s = Schedule.build(**dict(ROWS, warps=8), rows_per_tile=64, kv_format=kv)
        assert api._metadata_plan(lens, rows, s)[0] == parts, (kv, rows)
