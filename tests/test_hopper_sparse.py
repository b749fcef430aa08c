"""Token-sparse decode on Hopper without a GPU: the rules' choices, the library names, the
FlashMLA 9241ae3 argument checks (InputError before anything reaches a device) and the
row lengths and sink scaling of mlagen/backends/hopper/sparse.py against the reference's."""

from __future__ import annotations


import pytest
import torch

from mlagen.errors import InputError, MlagenError, ScheduleError
from mlagen.schedule.records import Schedule
from mlagen.schedule.rules import check

from mlagen.backends.hopper import api, sparse

SPARSE = dict(target="hopper", attention="sparse", topk=2048, causal=False, block_kv=64,
              buffers=2, warps=4, mainloop="wgmma")


@pytest.mark.parametrize("kv,rows", [("", 16), ("fp8_ds_mla", 32), ("", 32), ("", 64),
                                     ("fp8_ds_mla", 64)])
def test_sparse_schedules_are_legal(kv, rows):
    s = Schedule.build(**{**SPARSE, "warps": 8 if rows == 64 else 4}, kv_format=kv,
                       rows_per_tile=rows, page_size=1)
    check(s)
    assert "sparse" in s.variant_name()


@pytest.mark.parametrize("knobs,key", [
    (dict(kv_format="fp8_e4m3"), "kv_format"),
    (dict(dtype="fp16"), "kv_format"),
    (dict(extra_topk=64, extra_kv_format="fp8_ds_mla"), "extra_kv_format"),
    (dict(rows_per_tile=64, warps=4), "warps"),
    (dict(mainloop="mma_sync", block_kv=32), "mainloop"),
])
def test_sparse_refusals(knobs, key):
    with pytest.raises(ScheduleError) as e:
        check(Schedule.build(**{**SPARSE, "rows_per_tile": 16, **knobs}))
    assert key.replace("_", " ") in e.value.message.replace("_", " ") or key in e.value.message


def test_runtime_fields_share_one_library():
    a = sparse.sparse_schedule(16, "bf16")
    b = sparse.sparse_schedule(
        16, "bf16", Schedule.build(**{**SPARSE, "topk": 77, "sinks": True}, rows_per_tile=16,
                                   page_size=16))
    assert a.variant_name() == b.variant_name()
    assert sparse.sparse_schedule(17, "bf16").mapping.rows_per_tile == 32
    # beyond 32 heads: 64-row tiles where the call has enough query tokens (fewer beyond 64)
    assert sparse.sparse_schedule(128, "bf16").mapping.rows_per_tile == 32
    assert sparse.sparse_schedule(128, "fp8_ds_mla", None, True).mapping.rows_per_tile == 64
    assert sparse.sparse_schedule(128, "fp8_ds_mla", None, True).mapping.warps == 8
    assert sparse.sparse_schedule(32, "bf16", None, True).mapping.rows_per_tile == 32
    cases = ((128, 2), (128, 4), (65, 4), (64, 8), (64, 16), (64, 32), (33, 32), (32, 4096))
    assert [sparse.wide_rows(h, n) for h, n in cases] == \
        [False, True, True, False, True, True, True, False]
    assert [sparse.wide_rows(h, n, "fp8_ds_mla") for h, n in cases] == \
        [False, True, True, False, False, True, True, False]
    assert sparse.wide_rows(64, 16, "fp8_ue8m0_paged") is False
    wide = Schedule.build(**{**SPARSE, "warps": 8}, rows_per_tile=64)
    assert sparse.sparse_schedule(128, "bf16", wide).mapping.rows_per_tile == 64


def test_sparse_64_row_render_takes_the_64_row_kernel_with_sp():
    from mlagen.backends import hopper
    src = hopper.render(sparse.sparse_schedule(
        128, "bf16", Schedule.build(**{**SPARSE, "warps": 8}, rows_per_tile=64))).files["split.cu"]
    assert '#include "mla_wgmma.cuh"' in src
    assert "launch_split_wgmma_impl<__nv_bfloat16, kFault, 1>" in src
    assert "split_cluster(int, int) { return 1; }" in src
    ds = hopper.render(Schedule.build(
        target="hopper", kv_format="fp8_ds_mla", attention="sparse", topk=2048, causal=False,
        rows_per_tile=64, warps=8, block_kv=64, buffers=2, mainloop="wgmma")).files["split.cu"]
    assert "launch_split_wgmma_impl<__nv_bfloat16, kFault, 1, 2>" in ds   # kKvDsMla


def test_fp8_dense_rows_take_the_64_row_kernel_in_d_qk_576_formats_only():
    r64 = dict(target="hopper", rows_per_tile=64, warps=8, block_kv=64, buffers=2,
               mainloop="wgmma")
    check(Schedule.build(kv_format="fp8_ds_mla", **r64))   # no error
    with pytest.raises(ScheduleError) as e:
        check(Schedule.build(kv_format="fp8_ue8m0_paged", **r64))
    assert "kv_format" in e.value.message


def _args(**over):
    kw = dict(q=torch.zeros(2, 2, 16, 576, dtype=torch.bfloat16),
              k_cache=torch.zeros(4, 64, 1, 656, dtype=torch.uint8), block_table=None,
              cache_seqlens=None, head_dim_v=512, tile_scheduler_metadata=api.get_mla_metadata()[0],
              is_fp8_kvcache=True, indices=torch.zeros(2, 2, 64, dtype=torch.int32))
    kw.update(over)
    return kw


@pytest.mark.parametrize("over,words", [
    (dict(is_fp8_kvcache=False), "is_fp8_kvcache"),
    (dict(causal=True), "causal"),
    (dict(q=torch.zeros(2, 2, 16, 576, dtype=torch.float16)), "bfloat16 q"),
    (dict(q=torch.zeros(2, 9, 16, 576, dtype=torch.bfloat16)), "s_q in 1..8"),
    (dict(q=torch.zeros(2, 2, 129, 576, dtype=torch.bfloat16)), "h_q in 1..128"),
    (dict(k_cache=torch.zeros(4, 64, 1, 576, dtype=torch.uint8)), "656"),
    (dict(k_cache=torch.zeros(4, 64, 1, 576, dtype=torch.float16), is_fp8_kvcache=False),
     "reads bfloat16 or fp8_ds_mla"),
    (dict(k_cache=torch.zeros(4, 512, 1, 656, dtype=torch.uint8)), "page size 1..256"),
    (dict(indices=torch.zeros(2, 2, 64, dtype=torch.int64)), "indices must be int32"),
    (dict(indices=torch.zeros(2, 1, 64, dtype=torch.int32)), "indices must be int32"),
    (dict(indices=torch.zeros(2, 2, 0, dtype=torch.int32)), "topk = 0"),
    (dict(topk_length=torch.zeros(3, dtype=torch.int32)), "topk_length must be int32 [b = 2]"),
    (dict(attn_sink=torch.zeros(16, dtype=torch.float16)), "attn_sink must be fp32"),
    (dict(head_dim_v=256), "head_dim_v"),
    (dict(softmax_scale=-1.0), "softmax_scale"),
    (dict(extra_k_cache=torch.zeros(4, 64, 1, 656, dtype=torch.uint8)), "given alone"),
    (dict(num_splits=torch.zeros(3, dtype=torch.int32)), "num_splits must be None"),
    (dict(indices=None, attn_sink=torch.zeros(16)), "give indices too"),
    (dict(tile_scheduler_metadata="x"), "FlashMLASchedMeta"),
])
def test_argument_checks(over, words):
    with pytest.raises(InputError) as e:
        api.flash_mla_with_kvcache(**_args(**over))
    assert words in str(e.value)


def test_cpu_tensors_are_refused_after_the_shape_checks():
    with pytest.raises(InputError, match="CUDA"):
        api.flash_mla_with_kvcache(**_args())


def test_get_mla_metadata_forms():
    sched, none = api.get_mla_metadata()
    assert none is None and isinstance(sched, sparse.FlashMLASchedMeta)
    assert not sched.have_initialized
    with pytest.raises(InputError):
        api.get_mla_metadata(torch.zeros(2, dtype=torch.int32))


def test_row_lengths_clip_and_repeat():
    tl = torch.tensor([0, 5, 900], dtype=torch.int32)
    got = sparse.row_lengths(tl, 3, 2, 100, "cpu")
    assert got.tolist() == [0, 0, 5, 5, 100, 100] and got.dtype == torch.int32
    assert sparse.row_lengths(None, 2, 3, 7, "cpu").tolist() == [7] * 6


@pytest.mark.parametrize("b", [1, 2, 5])
@pytest.mark.parametrize("s_q", [1, 6])
def test_row_lengths_own_every_int_the_scheduler_reads(b, s_q):
    """The scheduler kernel reads b * s_q ints by pointer: a stride-0 view (expand + reshape
    of one sequence's length) made it read past a 4-byte storage on the H200."""
    got = sparse.row_lengths(torch.arange(b, dtype=torch.int32) + 3, b, s_q, 100, "cpu")
    assert got.is_contiguous() and got.stride() == (1,)
    assert got.untyped_storage().nbytes() >= 4 * b * s_q
    assert got.tolist() == [3 + i for i in range(b) for _ in range(s_q)]


def _ref_runner(seen, wrong=False):
    from mlagen import reference

    def run(inputs, out=None):
        seen.append(type(inputs).__name__)
        if wrong:                            # a kernel that ignores the sinks
            import dataclasses
            inputs = dataclasses.replace(inputs, attn_sink=None)
        o = reference.run(inputs, dtype=torch.float32, rounded=("p",))
        if out is None:
            return o
        out.out.copy_(o.out)
        out.lse.copy_(o.lse)
        return out
    return run


@pytest.mark.parametrize("wrong", [False, True])
def test_verify_draws_sparse_cases(wrong):
    """mlagen verify on the sparse example reaches the sparse path (SparseInputs, its
    reference) and catches a runner that drops the sinks."""
    from mlagen.schedule import load
    from mlagen.paths import SCHEDULES_DIR
    from mlagen.verify.runner import verify

    seen: list = []
    r = verify(load(str(SCHEDULES_DIR / "hopper_sparse_ds_mla.toml")), examples=3,
               profile="smoke", runner=_ref_runner(seen, wrong), isolate=False,
               progress=False, device="cpu", save_failures=False, seed=1,
               shrink_budget_s=1.0)
    assert set(seen) == {"SparseInputs"}
    assert r.ok != wrong, r.failure and r.failure.message


# ------------------------------------------------ d_qk 512 (kv_lora_rank 448, V = all 512)
D512 = dict(SPARSE, kv_lora_rank=448, rope_dim=64, v_dim=512, topk=128)


@pytest.mark.parametrize("kv,rows", [("", 16), ("", 32), ("", 64), ("fp8_ue8m0_paged", 16),
                                     ("fp8_ue8m0_paged", 32), ("fp8_ue8m0_paged", 64)])
def test_d512_schedules_are_legal(kv, rows):
    s = Schedule.build(**{**D512, "warps": 8 if rows == 64 else 4}, kv_format=kv,
                       rows_per_tile=rows, page_size=256)
    check(s)
    assert "dqk512" in s.variant_name()
    src = __import__("mlagen.backends.hopper", fromlist=["render"]).render(s).files
    assert all("#define MLAGEN_D_QK 512" in text for text in src.values())


@pytest.mark.parametrize("knobs,words", [
    (dict(attention="dense", topk=0), "sparse modes alone"),
    (dict(mainloop="mma_sync"), "sparse modes alone"),
    (dict(kv_format="fp8_e4m3"), "d_qk 512 reads bf16 or fp8_ue8m0_paged"),
    (dict(v_dim=448), "v_dim = 448"),
    (dict(kv_lora_rank=256, v_dim=0), "kv_lora_rank = 512 or 448"),
])
def test_d512_refusals(knobs, words):
    with pytest.raises(ScheduleError) as e:
        check(Schedule.build(**{**D512, "rows_per_tile": 16, **knobs}))
    assert words in e.value.message


def test_d576_refuses_the_paged_format():
    with pytest.raises(ScheduleError) as e:
        check(Schedule.build(**SPARSE, rows_per_tile=16, kv_format="fp8_ue8m0_paged",
                             kv_lora_rank=512))
    assert "d_qk 512's format" in e.value.message


def test_d512_default_schedules():
    s = sparse.sparse_schedule(128, "fp8_ue8m0_paged", None, True, 2, 512)
    assert (s.problem.d, s.problem.dv, s.mapping.rows_per_tile) == (512, 512, 64)
    assert sparse.sparse_schedule(128, "bf16", None, False, 1, 512).mapping.rows_per_tile == 32
    assert sparse.sparse_schedule(16, "bf16", None, False, 1, 512).mapping.rows_per_tile == 16
    with pytest.raises(InputError, match="d_qk = 512"):
        sparse.sparse_schedule(16, "fp8_ue8m0_paged", s, False, 2, 576)


def _paged(blocks=4, page=64, pad=True):
    """A fp8_ue8m0_paged cache view as FlashMLA's MODEL1 lays it out."""
    stride = -(-page * 584 // 576) * 576 if pad else page * 584
    buf = torch.zeros(blocks, stride, dtype=torch.uint8)
    return buf[:, :page * 584].view(blocks, page, 1, 584)


def _args512(**over):
    kw = dict(q=torch.zeros(2, 2, 16, 512, dtype=torch.bfloat16), k_cache=_paged(),
              indices=torch.zeros(2, 2, 64, dtype=torch.int32))
    kw.update(over)
    return _args(**kw)


@pytest.mark.parametrize("over,words", [
    (dict(k_cache=torch.zeros(4, 64, 1, 656, dtype=torch.uint8)), "fp8_ue8m0_paged (584 bytes"),
    (dict(k_cache=torch.zeros(4, 64, 1, 576, dtype=torch.bfloat16), is_fp8_kvcache=False),
     "must be [..., 512]"),
    (dict(q=torch.zeros(2, 2, 16, 576, dtype=torch.bfloat16)), "fp8_ds_mla (656 bytes"),
    (dict(q=torch.zeros(2, 2, 16, 448, dtype=torch.bfloat16)), "d_qk 576 or 512"),
    (dict(k_cache=_paged().transpose(0, 1).contiguous().transpose(0, 1)), "page's bytes"),
    (dict(k_cache=_paged(pad=False)[:, :, :, :584][:3]), "CUDA"),      # unpadded pages: taken
    (dict(extra_k_cache=torch.zeros(4, 64, 1, 584, dtype=torch.uint8),
          extra_indices_in_kvcache=torch.zeros(2, 2, 8, dtype=torch.int32)), "CUDA"),
    (dict(extra_k_cache=torch.zeros(4, 64, 1, 656, dtype=torch.uint8),
          extra_indices_in_kvcache=torch.zeros(2, 2, 8, dtype=torch.int32)), "one format"),
])
def test_d512_argument_checks(over, words):
    with pytest.raises(InputError) as e:
        api.flash_mla_with_kvcache(**_args512(**over))
    assert words in str(e.value)


@pytest.mark.nvcc
@pytest.mark.parametrize("kv,rows,pools", [("fp8_ue8m0_paged", 16, 2), ("fp8_ue8m0_paged", 32, 1),
                                           ("", 16, 1), ("", 32, 2)])
def test_d512_smem_model_and_registers(kv, rows, pools, tmp_path):
    """resources.hopper_smem == WgmmaRowsConfig<...>::kSmem built with MLAGEN_D_QK 512 (the
    model's copy of the raw block: data rows, then 16-byte scale rows), the ring its kSlots;
    the split kernel without spills or serialized wgmma."""
    import re

    from test_hopper_compile import _header_constant, _ptxas_split

    from mlagen.backends.hopper import render
    from mlagen.backends.hopper.abi import KV_CODE
    from mlagen.backends.hopper.resources import hopper_smem

    two = dict(extra_topk=512, extra_page_size=64, extra_kv_format=kv) if pools == 2 else {}
    s = Schedule.build(**D512, kv_format=kv, rows_per_tile=rows, page_size=256, **two)
    cfg = f"mlagen::hopper::WgmmaRowsConfig<{rows}, 1, {KV_CODE[kv or 'bf16']}, 1, 2, {pools}>"
    sm = hopper_smem(s)
    pre = "#define MLAGEN_D_QK 512\n"
    assert sm["total"] == _header_constant(tmp_path, "mla_wgmma_rows.cuh", cfg + "::kSmem", pre)
    assert sm["slots"] == _header_constant(tmp_path, "mla_wgmma_rows.cuh", cfg + "::kSlots", pre)
    log = _ptxas_split(render(s), tmp_path)
    assert "mla_split_wgmma_rows_kernel" in log
    spills = [int(n) for n in re.findall(r"(\d+) bytes spill stores", log)]
    assert spills and max(spills) == 0, log
    assert "serialized" not in log and "C7508" not in log, log


@pytest.mark.nvcc
@pytest.mark.parametrize("name", ["hopper_sparse_ds_mla_r64", "hopper_sparse_bf16_r64",
                                  "hopper_sparse_v4_r64"])
def test_64_row_sparse_examples_compile_without_spills(name, tmp_path):
    """The 64-row sparse kernels (in place and crossover) of the example schedules: no
    spill, setmaxnreg honoured, no wgmma serialized.  Their producer warpgroup runs at 88
    registers, where one more live value spills (a conversion rewrite did, in the two-pool
    d_qk 512 crossover)."""
    import re

    from test_hopper_compile import _ptxas_split

    from mlagen.backends.hopper import render
    from mlagen.paths import SCHEDULES_DIR
    from mlagen.schedule import load

    log = _ptxas_split(render(load(str(SCHEDULES_DIR / f"{name}.toml"))), tmp_path)
    assert "mla_split_wgmma_kernel" in log
    spills = [int(n) for n in re.findall(r"(\d+) bytes spill stores", log)]
    assert spills and max(spills) == 0, log
    assert "serialized" not in log and "C7508" not in log, log


@pytest.mark.nvcc
@pytest.mark.parametrize("kv,pools", [("fp8_ue8m0_paged", 2), ("", 1)])
def test_d512_64_rows_smem_model_and_registers(kv, pools, tmp_path):
    """The 64-row kernel at d_qk 512: resources.hopper_smem == WgmmaConfig::kSmem (Q's tile
    grown to the epilogue's staging, the side buffer of fp8_ue8m0_paged's last latent bytes
    and scale rows), the split kernel without spills or serialized wgmma."""
    import re

    from test_hopper_compile import _header_constant, _ptxas_split

    from mlagen.backends.hopper import render
    from mlagen.backends.hopper.resources import hopper_smem

    two = dict(extra_topk=512, extra_page_size=64, extra_kv_format=kv) if pools == 2 else {}
    s = Schedule.build(**{**D512, "warps": 8}, kv_format=kv, rows_per_tile=64, page_size=256,
                       **two)
    pre = "#define MLAGEN_D_QK 512\n"
    got = _header_constant(tmp_path, "mla_wgmma.cuh", "mlagen::hopper::WgmmaConfig::kSmem", pre)
    assert hopper_smem(s)["total"] == got
    log = _ptxas_split(render(s), tmp_path)
    assert "mla_split_wgmma_kernel" in log
    spills = [int(n) for n in re.findall(r"(\d+) bytes spill stores", log)]
    assert spills and max(spills) == 0, log
    assert "serialized" not in log and "C7508" not in log, log
