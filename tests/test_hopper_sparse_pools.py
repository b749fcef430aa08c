"""Token-sparse decode over two pools (FlashMLA's extra_k_cache) on Hopper without a GPU: the
rules, the two-pool variant's render and library name, the extra pool's argument checks
(InputError before anything reaches a device), the rows' lengths over both pools, and the
verifier drawing two-pool cases."""

from __future__ import annotations

import re

import pytest
import torch

from mlagen.errors import InputError, ScheduleError
from mlagen.paths import SCHEDULES_DIR
from mlagen.schedule import load
from mlagen.schedule.records import Schedule
from mlagen.schedule.rules import check

from mlagen.backends import hopper
from mlagen.backends.hopper import abi, api, defaults, sparse

POOLS = dict(target="hopper", attention="sparse", topk=2048, extra_topk=512, causal=False,
             block_kv=64, buffers=2, mainloop="wgmma")


def _two(rows=16, kv="", **knobs):
    return Schedule.build(**{**POOLS, **knobs}, kv_format=kv, rows_per_tile=rows,
                          warps=8 if rows == 64 else 4)


@pytest.mark.parametrize("kv,rows", [("", 16), ("", 32), ("", 64), ("fp8_ds_mla", 16),
                                     ("fp8_ds_mla", 32), ("fp8_ds_mla", 64)])
def test_two_pool_schedules_are_legal_and_render_sp2(kv, rows):
    s = _two(rows, kv, extra_page_size=2)
    check(s)
    assert "pools2" in s.variant_name()
    files = hopper.render(s).files
    flat = re.sub(r"\s+", " ", files["split.cu"])
    if rows == 64:
        assert f"launch_split_wgmma_impl<__nv_bfloat16, kFault, 2{', 2' if kv else ''}>" in flat
    else:
        assert re.search(r"launch_split_wgmma_rows_impl<[^>]*, 2>\(p,", flat), flat
    assert "mlagen_hopper_decode_pools" in files["api.cu"]
    assert "int mlagen_hopper_decode(" not in files["api.cu"]
    # the one-pool variant keeps the plain entry and SP = 1
    one = hopper.render(s.replace(extra_topk=0, extra_page_size=0)).files
    assert "mlagen_hopper_decode_pools" not in one["api.cu"]
    assert "int mlagen_hopper_decode(" in one["api.cu"]


def test_extra_shape_indices_match_the_entry():
    api_cu = hopper.render(_two()).files["api.cu"]
    for name, i in abi.EXTRA_INDEX.items():
        assert f"extra_shape[{i}]" in api_cu.split(f"p.{name} =")[1].split(";")[0]
    with pytest.raises(TypeError):
        abi.extra_array(k2_stride_block=1)


@pytest.mark.parametrize("knobs,key", [
    (dict(extra_kv_format="fp8_ds_mla"), "extra_kv_format"),
    (dict(kv_format="fp8_ds_mla", extra_kv_format="bf16"), "extra_kv_format"),
    (dict(extra_page_size=512), "extra_page_size"),
])
def test_two_pool_refusals(knobs, key):
    with pytest.raises(ScheduleError) as e:
        check(Schedule.build(**{**POOLS, "rows_per_tile": 16, "warps": 4, **knobs}))
    assert key in e.value.message


def test_extra_topk_and_page_are_run_time():
    a = defaults.canonical(_two(extra_page_size=2))
    b = defaults.canonical(_two(extra_topk=64, extra_page_size=128))
    one = defaults.canonical(_two(extra_topk=0))
    assert a.variant_name() == b.variant_name() != one.variant_name()
    assert sparse.sparse_schedule(16, "bf16", None, False, 2).problem.extra_topk > 0
    assert sparse.sparse_schedule(16, "bf16").problem.extra_topk == 0
    with pytest.raises(InputError, match="two pools"):
        sparse.sparse_schedule(16, "bf16", _two(), False, 1)
    with pytest.raises(InputError, match="one pool"):
        sparse.sparse_schedule(16, "bf16", _two(extra_topk=0), False, 2)


def test_example_schedule():
    s = load(str(SCHEDULES_DIR / "hopper_sparse_two_pools.toml"))
    check(s)
    p = s.problem
    assert (p.kv, p.kv_lora_rank + p.rope_dim, p.topk, p.extra_topk, p.heads) == \
        ("bf16", 576, 2048, 512, 16)


def _args(**over):
    kw = dict(q=torch.zeros(2, 2, 16, 576, dtype=torch.bfloat16),
              k_cache=torch.zeros(4, 64, 1, 576, dtype=torch.bfloat16), block_table=None,
              cache_seqlens=None, head_dim_v=512,
              tile_scheduler_metadata=api.get_mla_metadata()[0],
              indices=torch.zeros(2, 2, 64, dtype=torch.int32),
              extra_k_cache=torch.zeros(8, 2, 1, 576, dtype=torch.bfloat16),
              extra_indices_in_kvcache=torch.zeros(2, 2, 32, dtype=torch.int32),
              extra_topk_length=torch.zeros(2, dtype=torch.int32))
    kw.update(over)
    return kw


BF = torch.bfloat16


@pytest.mark.parametrize("over,words", [
    (dict(extra_k_cache=None), "extra_indices_in_kvcache and extra_topk_length given alone"),
    (dict(extra_indices_in_kvcache=None), "extra_k_cache and extra_topk_length given alone"),
    (dict(extra_k_cache=None, extra_indices_in_kvcache=None), "extra_topk_length given alone"),
    (dict(extra_k_cache="x"), "extra_k_cache must be a torch.Tensor"),
    (dict(extra_k_cache=torch.zeros(8, 2, 576, dtype=BF)), "extra_k_cache must be [num_blocks"),
    (dict(extra_k_cache=torch.zeros(8, 2, 2, 576, dtype=BF)), "extra_k_cache must be [num_blocks"),
    (dict(extra_k_cache=torch.zeros(8, 2, 1, 576, dtype=torch.float16)), "both pools in one"),
    (dict(extra_k_cache=torch.zeros(8, 2, 1, 656, dtype=torch.uint8)), "both pools in one"),
    (dict(extra_k_cache=torch.zeros(8, 2, 1, 512, dtype=BF)), "both pools in one"),
    (dict(extra_k_cache=torch.zeros(2, 512, 1, 576, dtype=BF)), "page size 1..256"),
    (dict(extra_k_cache=torch.zeros(0, 2, 1, 576, dtype=BF)), "at least one block"),
    (dict(extra_k_cache=torch.zeros(8, 2, 1, 580, dtype=BF)[..., :576]), "multiples of 16"),
    (dict(extra_k_cache=torch.zeros(8, 2, 1, 1152, dtype=BF)[..., ::2]), "contiguous"),
    (dict(extra_indices_in_kvcache=torch.zeros(2, 2, 32, dtype=torch.int64)),
     "extra_indices_in_kvcache must be int32 [b = 2, s_q = 2, extra_topk]"),
    (dict(extra_indices_in_kvcache=torch.zeros(2, 1, 32, dtype=torch.int32)),
     "extra_indices_in_kvcache must be int32"),
    (dict(extra_indices_in_kvcache=torch.zeros(2, 2, dtype=torch.int32)),
     "extra_indices_in_kvcache must be int32"),
    (dict(extra_indices_in_kvcache=torch.zeros(2, 2, 0, dtype=torch.int32)), "extra_topk = 0"),
    (dict(extra_topk_length=torch.zeros(3, dtype=torch.int32)),
     "extra_topk_length must be int32 [b = 2]"),
    (dict(extra_topk_length=torch.zeros(2, dtype=torch.int64)),
     "extra_topk_length must be int32 [b = 2]"),
    (dict(extra_topk_length=[1, 2]), "extra_topk_length must be int32 [b = 2], got list"),
    # the main pool's checks still come first
    (dict(indices=torch.zeros(2, 2, 64, dtype=torch.int64)), "indices must be int32"),
    (dict(indices=None), "give indices too"),
])
def test_extra_argument_checks(over, words):
    with pytest.raises(InputError) as e:
        api.flash_mla_with_kvcache(**_args(**over))
    assert words in str(e.value)
    assert "\n" not in str(e.value)


def test_extra_cpu_tensors_are_refused_after_the_shape_checks():
    """Well-formed two-pool inputs (a padded extra cache included) pass every shape check
    and stop at the device check."""
    for x in (torch.zeros(8, 2, 1, 576, dtype=BF), torch.zeros(8, 2, 1, 1152, dtype=BF)[..., :576]):
        with pytest.raises(InputError, match="must be on a CUDA device"):
            api.flash_mla_with_kvcache(**_args(extra_k_cache=x))


def test_fp8_ds_mla_pools_pass_the_shape_checks():
    """Two fp8_ds_mla pools (uint8 and float8_e4m3fn bytes alike) reach the device checks."""
    with pytest.raises(InputError, match="CUDA"):
        api.flash_mla_with_kvcache(**_args(
            k_cache=torch.zeros(4, 64, 1, 656, dtype=torch.uint8), is_fp8_kvcache=True,
            extra_k_cache=torch.zeros(8, 2, 1, 656, dtype=torch.float8_e4m3fn)))


def test_two_pool_lengths():
    main = sparse.row_lengths(torch.tensor([0, 5, 900], dtype=torch.int32), 3, 2, 100, "cpu")
    extra = sparse.row_lengths(torch.tensor([7, 0, 30], dtype=torch.int32), 3, 2, 20, "cpu")
    total, len1 = sparse.two_pool_lengths(main, extra)
    assert total.tolist() == [7, 7, 5, 5, 120, 120]
    assert len1.tolist() == [0, 0, 5, 5, 100, 100]
    assert total.dtype == len1.dtype == torch.int32 and total.is_contiguous()
    # a negative length in either pool: the row's count is negative (the kernel flags it)
    bad, _ = sparse.two_pool_lengths(torch.tensor([3, -1, 2], dtype=torch.int32),
                                     torch.tensor([1, 4, -2], dtype=torch.int32))
    assert bad.tolist() == [4, -1, -1]
    none, _ = sparse.two_pool_lengths(sparse.row_lengths(None, 2, 1, 64, "cpu"),
                                      sparse.row_lengths(None, 2, 1, 32, "cpu"))
    assert none.tolist() == [96, 96]


def test_verify_draws_two_pool_cases():
    """The example's verify draws both pools (each page size, extra lengths with a 0,
    invalid entries, NaN in unnamed slots of both caches) and catches a runner that drops
    the extra pool."""
    from mlagen.verify.sparse import sparse_path_cases
    from mlagen.verify.runner import verify
    from mlagen import reference

    s = load(str(SCHEDULES_DIR / "hopper_sparse_two_pools.toml"))
    cases = sparse_path_cases(s)
    assert any(0 in c.extra_seqlens for c in cases)
    inp = cases[0].inputs()
    assert len(inp.pools) == 2
    assert [p.k_cache.shape[1] for p in inp.pools] == [64, 2]
    assert all(torch.isnan(p.k_cache.float()).any() for p in inp.pools)
    assert all(bool((p.indices < 0).any()) for p in inp.pools)       # -1 in either pool
    x = inp.pools[1]
    assert x.topk_length is not None and int(x.topk_length[1]) == 0   # extra_topk_length 0
    assert int(x.topk_length.max()) > 0

    def run_with(drop):
        seen = []

        def run(inputs, out=None):
            seen.append(len(inputs.pools))
            if drop:
                import dataclasses
                inputs = dataclasses.replace(inputs, pools=inputs.pools[:1])
            o = reference.run(inputs, dtype=torch.float32, rounded=("p",))
            if out is not None:
                out.out.copy_(o.out)
                out.lse.copy_(o.lse)
                return out
            return o
        r = verify(s, examples=3, profile="smoke", runner=run, isolate=False, progress=False,
                   device="cpu", save_failures=False, seed=1, shrink_budget_s=1.0)
        return r, seen
    r, seen = run_with(False)
    assert r.ok, r.failure and r.failure.message
    assert set(seen) == {2}
    r, _ = run_with(True)
    assert not r.ok
