"""The verifier's power on Hopper: every fault planted in the Hopper kernels (one line of the
split or combine kernel, MLAGEN_FAULT) makes `verify` fail, on the example schedules that
cover the 16-, 32- and 64-row tiles, bf16 and fp16, pages of 1, 16 and 64 tokens; and those
examples pass unfaulted."""

import pytest
import torch

from mlagen.paths import SCHEDULES_DIR
from mlagen.schedule import load
from mlagen.verify.strategies import Bounds


def gpu(f):
    return pytest.mark.cuda(pytest.mark.skipif(not torch.cuda.is_available(),
                                               reason="needs an NVIDIA GPU")(f))


BOUNDS = Bounds(max_batch=4, max_len=300, long_len=1500, max_extra_table=2)
EXAMPLES = ("hopper_tp8_r16", "hopper_h16_pg16", "hopper_h200", "hopper_r64_fp16_pg1",
            "hopper_wgmma_r16", "hopper_wgmma_r32_fp16", "hopper_wgmma_r16_w8",
            "hopper_fp8_e4m3", "hopper_fp8_ds_mla")
# each fault on a different tile size / dtype / page size (every example gets one)
FAULTED = [("causal_off_by_one", "hopper_tp8_r16"), ("early_buffer_swap", "hopper_tp8_r16"),
           ("skip_partial_page", "hopper_h16_pg16"), ("wrong_scale", "hopper_h200"),
           ("bad_split_merge", "hopper_r64_fp16_pg1"),
           # the few-rows wgmma kernel (mla_wgmma_rows.cuh)
           ("causal_off_by_one", "hopper_wgmma_r16"), ("skip_partial_page", "hopper_wgmma_r32_fp16"),
           # its two-consumer-warpgroup form (warps = 8)
           ("skip_partial_page", "hopper_wgmma_r16_w8"), ("causal_off_by_one", "hopper_wgmma_r16_w8"),
           ("wrong_scale", "hopper_wgmma_r32_w8"),
           # the dequantization of 8-bit caches (mla_fp8.cuh's converter, the consumer's
           # descale)
           ("kv_scale_wrong_tile", "hopper_fp8_ds_mla"), ("kv_scale_twice", "hopper_fp8_ds_mla"),
           ("descale_not_in_output", "hopper_fp8_e4m3"), ("kv_scale_twice", "hopper_fp8_e4m3")]


def test_each_planted_fault_is_observable_on_its_example():
    """(CPU) A causal off-by-one shows only where a query sees fewer keys than the sequence
    has, i.e. s_q >= 2: an example with max_s_q = 1 could never catch it (the r32_w8 pairing
    did exactly that until a GPU run failed it)."""
    for fault, example in FAULTED:
        s = load(SCHEDULES_DIR / f"{example}.toml")
        if fault == "causal_off_by_one":
            assert s.problem.max_s_q >= 2, (fault, example)
        if fault == "skip_partial_page":
            assert s.problem.page_size > 1, (fault, example)


@gpu
@pytest.mark.parametrize("fault,example", FAULTED)
def test_planted_fault_is_caught(fault, example):
    from mlagen.verify import verify

    s = load(SCHEDULES_DIR / f"{example}.toml").with_fault(fault)
    r = verify(s, examples=40, progress=False, bounds=BOUNDS, shrink_budget_s=20)
    assert not r.ok, f"verify did not catch {fault} on {example}:\n{r.summary()}"


@gpu
@pytest.mark.parametrize("example", EXAMPLES)
def test_example_passes(example):
    from mlagen.verify import verify

    r = verify(load(SCHEDULES_DIR / f"{example}.toml"), examples=30, progress=False,
               bounds=BOUNDS)
    assert r.ok, r.summary()


@gpu
def test_api_defaults_verify_across_row_classes():
    """The API's default variants (no schedule): 16 heads with s_q up to 4 packs 16-64 rows,
    so the drawn shapes reach every size class's default tile."""
    from mlagen.schedule.records import Schedule
    from mlagen.verify import verify

    s = Schedule.build(name="api-defaults", target="hopper", heads=16, max_s_q=4,
                       page_size=16)
    r = verify(s, examples=40, progress=False, bounds=BOUNDS,
               runner_factory="mlagen.backends.hopper:defaults_runner")
    assert r.ok, r.summary()


@gpu
def test_api_defaults_verify_the_wgmma_kernels():
    """The same through pages of 64 tokens, where every size class's default is a wgmma
    kernel: the few-rows one with 16 rows (one consumer warpgroup) and 32 rows (two), and
    the 64-row one."""
    from mlagen.schedule.records import Schedule
    from mlagen.verify import verify

    s = Schedule.build(name="api-defaults-wgmma", target="hopper", heads=16, max_s_q=4,
                       page_size=64)
    r = verify(s, examples=40, progress=False, bounds=BOUNDS,
               runner_factory="mlagen.backends.hopper:defaults_runner")
    assert r.ok, r.summary()



@gpu
def test_verify_reaches_the_cluster_merge_and_catches_its_fault():
    """hopper_wgmma's verify runs the cluster-merge batch (backend verify_paths: parts / 2
    near-equal requests, which the profiles' batches never reach) before the drawn ones, and
    a fault planted in the merge (bad_split_merge: the halves summed unweighted) fails there."""
    from mlagen.backends.hopper import scheduler
    from mlagen.backends.hopper.ops import sm_count
    from mlagen.verify import verify

    s = load(SCHEDULES_DIR / "hopper_wgmma.toml")
    b = len(scheduler.cluster_lengths(s.heads_per_device, sm_count(torch.device("cuda"))))
    assert b > 0
    r = verify(s, examples=3, progress=False, bounds=BOUNDS)
    assert r.ok, r.summary()
    assert any(n.startswith("the cluster merge: reached") for n in r.notes), r.notes
    rf = verify(s.with_fault("bad_split_merge"), examples=1, progress=False, bounds=BOUNDS,
                shrink_budget_s=5, save_failures=False)
    assert not rf.ok and rf.failure.case_fields["batch"] == b, rf.summary()


def test_sparse_64_row_schedules_get_no_dense_cluster_merge_case(monkeypatch):
    """The cluster-merge batch is a dense case for the dense 64-row kernel; the sparse 64-row
    kernel makes no cluster merge (mla_wgmma.cuh), and that dense case on its 16-token pages
    was rejected before launch, so verify's first example raised on a sparse r64 schedule."""
    import mlagen.backends.hopper.ops as ops
    from mlagen.backends import backend

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(ops, "sm_count", lambda device: 132)
    be = backend("hopper")
    dense = be.verify_paths(load(SCHEDULES_DIR / "hopper_wgmma.toml"), "cuda")
    assert [n for n, _ in dense] == ["the cluster merge"]
    for name in ("hopper_sparse_bf16_r64", "hopper_sparse_ds_mla_r64", "hopper_sparse_v4_r64"):
        s = load(SCHEDULES_DIR / f"{name}.toml")
        assert s.mapping.rows_per_tile == 64 and s.problem.attention == "sparse"
        assert be.verify_paths(s, "cuda") == []


def test_crossover_mutants_reach_their_path():
    """The crossover runs where a call's query rows fill two 64-row tiles (a cluster of 2, the
    8-bit formats; sparse: a token's two tiles at h_q 128, dense: row tiles in pairs); each
    crossover mutant's example schedule must have the heads for it, and verify must draw head
    counts of one tile and of two (a full and a partial second tile), or the mutant's faults
    could never be reached."""
    from mlagen.backends import backend
    from mlagen.backends.hopper.mutants import MUTANTS

    be = backend("hopper")
    cross = [m for m in MUTANTS if "cross_peer" in m.name or "cross_rope" in m.name]
    assert len(cross) == 4
    for m in cross:
        for name in m.schedules:
            s = load(SCHEDULES_DIR / f"{name}.toml")
            rows = s.mapping.rows_per_tile
            assert rows == 64
            assert s.problem.kv_format in ("fp8_ds_mla", "fp8_ue8m0_paged", "fp8_e4m3")
            heads = be.runtime_shapes(s)["heads"]
            assert s.heads_per_device == 2 * rows and max(heads) == 2 * rows
            assert any(h <= rows for h in heads) and any(rows < h < 2 * rows for h in heads)
