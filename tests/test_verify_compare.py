"""compare.py on hand-made tensors: each tolerance, NaN/inf masks, cos-diff, shapes."""

import math

import pytest
import torch

from mlagen.problem import MlaOutputs
from mlagen.verify.compare import TOLERANCES, Tolerance, compare, compare_tensor, cos_diff

BF16 = TOLERANCES["bf16"]


def outs(out, lse, dtype=torch.bfloat16):
    return MlaOutputs(out=out.to(dtype), lse=lse.float())


def ref_pair(seed=0):
    g = torch.Generator().manual_seed(seed)
    out = torch.randn(2, 1, 4, 8, generator=g, dtype=torch.float64)
    lse = torch.randn(2, 4, 1, generator=g, dtype=torch.float64) * 3
    return out, lse


def test_identical_after_rounding_passes():
    out, lse = ref_pair()
    c = compare(outs(out, lse), MlaOutputs(out, lse), "bf16")
    assert c.ok, c.summary()


def test_one_bad_element_is_named():
    out, lse = ref_pair()
    bad = out.clone()
    bad[1, 0, 2, 5] += 0.5
    c = compare(outs(bad, lse), MlaOutputs(out, lse), "bf16")
    assert not c.ok
    rep = c.tensors[0]
    assert rep.name == "out" and rep.n_bad == 1 and rep.worst == (1, 0, 2, 5)
    assert rep.max_abs == pytest.approx(0.5, rel=0.02)
    assert "[1, 0, 2, 5]" in c.summary()


def test_abs_or_rel_per_element():
    tol = Tolerance(atol=1e-3, rtol=1e-2, cos=1.0)
    r = torch.tensor([0.0, 100.0, 1e-4], dtype=torch.float64)
    # first within atol only, second within rtol only, third within atol only
    a = torch.tensor([9e-4, 100.9, 5e-4], dtype=torch.float64)
    assert compare_tensor("x", a, r, tol).ok
    a = torch.tensor([2e-3, 100.0, 1e-4], dtype=torch.float64)     # beyond both
    rep = compare_tensor("x", a, r, tol)
    assert not rep.ok and rep.n_bad == 1 and rep.worst == (0,)
    a = torch.tensor([0.0, 101.5, 1e-4], dtype=torch.float64)      # 1.5% > rtol, > atol
    assert not compare_tensor("x", a, r, tol).ok


def test_lse_thresholds_are_tight():
    out, lse = ref_pair()
    off = lse.clone()
    off[0, 0, 0] *= 1 + 4e-4                     # 4e-4 relative: beyond 8.01/65536
    c = compare(outs(out, off), MlaOutputs(out, lse), "bf16")
    assert not c.ok and c.tensors[1].n_bad == 1


def test_nan_where_reference_is_finite_fails():
    out, lse = ref_pair()
    a = out.clone()
    a[0, 0, 0, 0] = float("nan")
    c = compare(outs(a, lse), MlaOutputs(out, lse), "bf16")
    assert not c.ok and c.tensors[0].n_nan_mismatch == 1
    assert "NaN" in c.summary()


def test_matching_nan_and_inf_masks_pass():
    out, lse = ref_pair()
    lse[1, 2, 0] = math.inf                      # a row that sees no key: lse = +inf
    out[1, 0, 2] = 0
    c = compare(outs(out, lse), MlaOutputs(out, lse), "bf16")
    assert c.ok, c.summary()
    r = torch.tensor([1.0, float("nan")], dtype=torch.float64)
    assert compare_tensor("x", r.clone(), r, BF16["out"]).ok


def test_inf_mismatches_fail():
    out, lse = ref_pair()
    ref_lse = lse.clone()
    ref_lse[1, 2, 0] = math.inf
    got = ref_lse.clone()
    got[1, 2, 0] = -math.inf                     # wrong sign of inf
    c = compare(outs(out, got), MlaOutputs(out, ref_lse), "bf16")
    assert not c.ok and c.tensors[1].n_inf_mismatch == 1
    got[1, 2, 0] = 1e30                          # finite where inf expected
    c = compare(outs(out, got), MlaOutputs(out, ref_lse), "bf16")
    assert not c.ok and c.tensors[1].n_inf_mismatch == 1


def test_cos_diff_catches_small_systematic_error():
    # every element 1.2% off: within rtol 2.01/128 each, but cos-diff ~ 3.6e-5 > 5e-6
    g = torch.Generator().manual_seed(1)
    r = torch.randn(64, 64, generator=g, dtype=torch.float64)
    a = r * torch.where(torch.rand(64, 64, generator=g) < 0.5, 1.012, 0.988).double()
    rep = compare_tensor("out", a, r, BF16["out"])
    assert rep.n_bad == 0 and rep.cos_diff > 5e-6 and not rep.ok
    assert cos_diff(r, r) == pytest.approx(0.0, abs=1e-15)


def test_shape_and_dtype_mismatch():
    out, lse = ref_pair()
    c = compare(outs(out[:, :, :3], lse), MlaOutputs(out, lse), "bf16")
    assert not c.ok and "shape" in c.summary()
    c = compare(MlaOutputs(out.float(), lse.float()), MlaOutputs(out, lse), "bf16")
    assert not c.ok and "dtype" in c.summary()
    c = compare(MlaOutputs(out.to(torch.bfloat16), lse.double()), MlaOutputs(out, lse), "bf16")
    assert not c.ok and "lse.dtype" in c.summary()


def test_fp16_is_tighter_than_bf16():
    r = torch.tensor([1.0], dtype=torch.float64)
    a = torch.tensor([1.01], dtype=torch.float64)     # 1%: ok in bf16, not in fp16
    # per element (a single element's cos-diff is large; it is the elementwise rule here)
    assert compare_tensor("out", a, r, TOLERANCES["bf16"]["out"]).n_bad == 0
    assert compare_tensor("out", a, r, TOLERANCES["fp16"]["out"]).n_bad == 1
    with pytest.raises(ValueError, match="no tolerances"):
        compare(MlaOutputs(a, a), MlaOutputs(r, r), "fp8")


def test_tolerance_override():
    out, lse = ref_pair()
    a = out + 0.01
    assert not compare(outs(a, lse), MlaOutputs(out, lse), "bf16").ok
    loose = {"out": Tolerance(0.05, 0.0, 1.0)}
    assert compare(outs(a, lse), MlaOutputs(out, lse), "bf16", loose).ok
