"""Comparing a kernel's outputs with the reference's, element by element.

An element passes when it is within an absolute OR a relative tolerance of the reference
(FlashMLA's rule); a tensor passes when every element passes, its cosine difference is below
a bound, and its NaN / +inf / -inf positions are exactly the reference's.  The reference is
float64, computed on the same (bf16- or fp16-rounded) inputs the kernel got, so only the
kernel's own arithmetic is measured.  See docs/verification.md for where the numbers come
from.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional

import torch

from ..problem import MlaOutputs


@dataclass(frozen=True)
class Tolerance:
    atol: float        # |a - r| <= atol ...
    rtol: float        # ... OR |a - r| <= rtol * |r|
    cos: float         # 1 - cos(a, r) over the finite elements must stay below this


# out: FlashMLA's bf16 test thresholds (abs 8e-4 OR rel 2.01/128, i.e. two bf16 ulps, and
# cos-diff < 5e-6).  fp16 has three more mantissa bits: the same rule scaled by 1/8.
# lse is fp32 on both input dtypes and its error comes from fp32 arithmetic only, so it
# keeps FlashMLA's lse thresholds for both.
TOLERANCES: dict[str, dict[str, Tolerance]] = {
    "bf16": {"out": Tolerance(8e-4, 2.01 / 128, 5e-6),
             "lse": Tolerance(1e-6, 8.01 / 65536, 5e-6)},
    "fp16": {"out": Tolerance(1e-4, 2.01 / 1024, 5e-6),
             "lse": Tolerance(1e-6, 8.01 / 65536, 5e-6)},
}

_DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16"}


def tolerances_for(dtype) -> dict[str, Tolerance]:
    """The tolerances of an input dtype, given as "bf16"/"fp16" or a torch dtype."""
    name = _DTYPE_NAMES.get(dtype, dtype)
    if name not in TOLERANCES:
        raise ValueError(f"no tolerances for dtype {dtype!r}; known: {', '.join(TOLERANCES)}")
    return TOLERANCES[name]


def cos_diff(a: torch.Tensor, r: torch.Tensor) -> float:
    """FlashMLA's cosine difference 1 - 2<a,r> / (|a|^2 + |r|^2), in float64 (0 if both 0)."""
    a, r = a.double().flatten(), r.double().flatten()
    den = float((a * a + r * r).sum())
    if den < 1e-12:
        return 0.0
    return 1.0 - 2.0 * float((a * r).sum()) / den


@dataclass
class TensorReport:
    """How one output tensor compares.  `bad` lists up to a few failing elements."""

    name: str
    ok: bool
    shape: tuple
    total: int
    n_bad: int = 0                 # elements outside both tolerances
    n_nan_mismatch: int = 0        # NaN in one and not the other
    n_inf_mismatch: int = 0        # +inf / -inf positions (or signs) that differ
    max_abs: float = 0.0           # over elements finite in both
    max_rel: float = 0.0
    worst: Optional[tuple] = None  # index of the largest |a - r| beyond atol
    cos_diff: float = 0.0
    tol: Optional[Tolerance] = None
    problem: str = ""              # shape / dtype mismatch, when there is one
    bad: list = field(default_factory=list)   # (index, actual, reference) samples

    def summary(self) -> str:
        if self.problem:
            return f"{self.name}: {self.problem}"
        head = (f"{self.name}: {self.n_bad}/{self.total} elements wrong; where both are "
                f"finite: max abs {self.max_abs:.3g}, max rel {self.max_rel:.3g}, "
                f"cos-diff {self.cos_diff:.3g}")
        if self.tol is not None:
            head += (f" (atol {self.tol.atol:g} or rtol {self.tol.rtol:.3g}; "
                     f"cos-diff < {self.tol.cos:g})")
        parts = [head]
        if self.n_nan_mismatch:
            parts.append(f"  NaN where the reference has none (or the reverse): "
                         f"{self.n_nan_mismatch} elements")
        if self.n_inf_mismatch:
            parts.append(f"  inf positions differ: {self.n_inf_mismatch} elements")
        for idx, a, r in self.bad:
            parts.append(f"  at {list(idx)}: got {a!r}, expected {r!r}")
        return "\n".join(parts)


def compare_tensor(name: str, actual: torch.Tensor, expected: torch.Tensor,
                   tol: Tolerance, samples: int = 5,
                   slack: Optional[torch.Tensor] = None,
                   cos_bar: "Optional[float | dict[str, float]]" = None) -> TensorReport:
    """Compare one tensor.  `slack` (same shape, >= 0) is added to atol per element: the
    oracle's allowance where a rounding inside the kernel may legitimately go either way.
    cos_bar: the oracle's own cosine bar where the kernel's expected error is larger than
    the dtype's (e4m3 MMAs: the weights' one-step roundings), one for all tensors or one
    per tensor name."""
    shape = tuple(expected.shape)
    total = expected.numel()
    if tuple(actual.shape) != shape:
        return TensorReport(name, False, shape, total, n_bad=total, tol=tol,
                            problem=f"shape {tuple(actual.shape)}, expected {shape}")
    # on the reference's device (a GPU when verify ran it there), samples read back at the end
    dev = expected.device
    a = actual.detach().to(dev, torch.float64)
    r = expected.detach().to(dev, torch.float64)
    a_nan, r_nan = torch.isnan(a), torch.isnan(r)
    nan_mis = a_nan ^ r_nan
    inf_mis = (torch.isinf(a) | torch.isinf(r)) & ~(a_nan | r_nan) & (a != r)
    finite = torch.isfinite(a) & torch.isfinite(r)
    diff = torch.where(finite, (a - r).abs(), torch.zeros_like(a))
    rel = torch.where(finite, diff / r.abs().clamp_min(1e-300), torch.zeros_like(a))
    atol = tol.atol if slack is None else tol.atol + slack.detach().to(dev, torch.float64)
    within = (diff <= atol) | (diff <= tol.rtol * r.abs())
    out_of_tol = finite & ~within
    bad_mask = out_of_tol | nan_mis | inf_mis
    cd = cos_diff(a[finite], r[finite]) if bool(finite.any()) else 0.0
    if isinstance(cos_bar, dict):
        cos_bar = cos_bar.get(name)
    if cos_bar is not None:
        tol = replace(tol, cos=max(tol.cos, cos_bar))
    n_bad = int(bad_mask.sum())
    rep = TensorReport(name, n_bad == 0 and cd < tol.cos, shape, total, n_bad=n_bad,
                       n_nan_mismatch=int(nan_mis.sum()), n_inf_mismatch=int(inf_mis.sum()),
                       max_abs=float(diff.max()) if total else 0.0,
                       max_rel=float(torch.where(out_of_tol, rel, torch.zeros_like(rel)).max())
                       if total else 0.0,
                       cos_diff=cd, tol=tol)
    if n_bad:
        # the worst finite offender first, then the first few other bad positions
        score = torch.where(out_of_tol, diff, torch.full_like(diff, -1.0))
        order = []
        if bool(out_of_tol.any()):
            flat = int(torch.argmax(score))
            order.append(flat)
            rep.worst = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), shape))
        for flat in torch.nonzero(bad_mask.flatten()).flatten()[:samples].tolist():
            if flat not in order:
                order.append(flat)
        for flat in order[:samples]:
            idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), shape))
            rep.bad.append((idx, float(a.flatten()[flat]), float(r.flatten()[flat])))
    return rep


@dataclass
class Comparison:
    ok: bool
    tensors: list[TensorReport]

    def summary(self) -> str:
        return "\n".join(t.summary() for t in self.tensors if not t.ok) or "outputs match"

    def __bool__(self) -> bool:
        return self.ok


def compare(actual: MlaOutputs, expected: MlaOutputs, dtype,
            tolerances: Optional[dict[str, Tolerance]] = None) -> Comparison:
    """Compare out and lse of a kernel with the reference.  `dtype` is the inputs' dtype
    ("bf16", "fp16" or a torch dtype); `tolerances` overrides the defaults per tensor."""
    tols = dict(tolerances_for(dtype))
    tols.update(tolerances or {})
    reports = []
    for name in ("out", "lse"):
        a, r = getattr(actual, name), getattr(expected, name)
        if a is None:
            reports.append(TensorReport(name, False, tuple(r.shape), r.numel(),
                                        n_bad=r.numel(), problem="missing (None)"))
            continue
        reports.append(compare_tensor(name, a, r, tols[name],
                                      slack=expected.extra.get("slack", {}).get(name),
                                      cos_bar=expected.extra.get("cos_bar")))
    if actual.out is not None:
        want = _expected_out_dtype(dtype)
        if want is not None and actual.out.dtype != want:
            reports.append(TensorReport("out.dtype", False, (), 0,
                                        problem=f"dtype {actual.out.dtype}, expected {want}"))
    if actual.lse is not None and actual.lse.dtype != torch.float32:
        reports.append(TensorReport("lse.dtype", False, (), 0,
                                    problem=f"dtype {actual.lse.dtype}, expected torch.float32"))
    return Comparison(all(t.ok for t in reports), reports)


def _expected_out_dtype(dtype):
    name = _DTYPE_NAMES.get(dtype, dtype)
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(name)
