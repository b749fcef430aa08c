"""Helpers of the Hopper tests: a small fp32 torch reference, FlashMLA's tolerances, the
random interleaver of the pipeline model tests, and a g++ build of host-side header code."""

from __future__ import annotations

import ctypes
import math
import shutil
import subprocess
from pathlib import Path

import torch


def reference(q, k_cache, block_table, cache_seqlens, softmax_scale, causal, dv=512,
              p_dtype=None):
    """(out fp32 [b, s_q, h_q, dv], lse fp32 [b, h_q, s_q]) by plain torch, per sequence.

    p_dtype: round the probabilities exp(s - rowmax) to this dtype before the PV product (the
    sum stays exact), as the kernels do (P goes to the tensor cores in q's dtype) and as the
    references of FlashMLA-style tests do (``p.type(v.dtype)``).  With randn data a few
    elements per thousand otherwise differ from the exact result by more than FlashMLA's
    element tolerance; the cos-diff check is made against the exact result."""
    b, s_q, h_q, d = q.shape
    page = k_cache.shape[1]
    out = torch.zeros(b, s_q, h_q, dv, dtype=torch.float32, device=q.device)
    lse = torch.full((b, h_q, s_q), float("inf"), dtype=torch.float32, device=q.device)
    for i in range(b):
        n = int(cache_seqlens[i])
        if n <= 0:
            continue
        pages = block_table[i, :math.ceil(n / page)].long()
        kv = k_cache[pages].reshape(-1, d)[:n].double()
        qi = q[i].double()
        sc = torch.einsum("shd,td->sht", qi, kv) * softmax_scale
        if causal:
            pos = n - s_q + torch.arange(s_q, device=q.device)
            vis = torch.arange(n, device=q.device)[None, :] <= pos[:, None]
        else:
            vis = torch.ones(s_q, n, dtype=torch.bool, device=q.device)
        sc = sc.masked_fill(~vis[:, None, :], float("-inf"))
        l = torch.logsumexp(sc, -1)                      # [s_q, h_q]
        if p_dtype is None:
            p = torch.exp(sc - l[..., None]).nan_to_num(0.0)
        else:
            mx = sc.amax(-1, keepdim=True)
            e = torch.exp(sc - mx).nan_to_num(0.0)
            p = e.to(p_dtype).double() / e.sum(-1, keepdim=True).clamp(min=1e-300)
        o = torch.einsum("sht,tv->shv", p, kv[:, :dv])
        seen = vis.any(-1)                               # [s_q]
        out[i] = torch.where(seen[:, None, None], o, torch.zeros_like(o)).float()
        lse[i] = torch.where(seen[None, :], l.T, torch.full_like(l.T, float("inf"))).float()
    return out, lse


def assert_close(x, y, name, abs_tol, rel_tol, cos_tol=None):
    """FlashMLA's check: NaN and inf masks equal; elementwise abs OR rel; cos-diff."""
    x, y = x.double(), y.double()
    assert x.shape == y.shape, f"{name}: shape {tuple(x.shape)} vs {tuple(y.shape)}"
    assert torch.equal(torch.isnan(x), torch.isnan(y)), f"{name}: NaN masks differ " \
        f"({int(torch.isnan(x).sum())} vs {int(torch.isnan(y).sum())})"
    assert torch.equal(torch.isinf(x), torch.isinf(y)), f"{name}: inf masks differ"
    assert torch.equal(x[torch.isinf(x)], y[torch.isinf(y)]), f"{name}: inf signs differ"
    fin = torch.isfinite(x)
    xf, yf = x[fin], y[fin]
    if xf.numel() == 0:
        return
    err = (xf - yf).abs()
    ok = (err <= abs_tol) | (err <= rel_tol * yf.abs())
    assert bool(ok.all()), (f"{name}: {int((~ok).sum())} of {ok.numel()} elements off; "
                            f"max abs err {float(err.max()):.3g}")
    if cos_tol is not None:
        denom = float((xf * xf + yf * yf).sum())
        if denom > 0:
            cos_diff = 1 - 2 * float((xf * yf).sum()) / denom
            assert cos_diff < cos_tol, f"{name}: cos-diff {cos_diff:.3g} >= {cos_tol}"


def flashmla_data(q, k_cache):
    """FlashMLA's test distribution: randn / 10 clamped to [-1, 1] (NaN slots stay NaN)."""
    return (q / 10).clamp(-1, 1), (k_cache / 10).clamp(-1, 1)


def rising_scores(q, k_cache, block_table, cache_seqlens, softmax_scale, step):
    """Scores that climb along each sequence by about `step` (log2 units) a 64-key block, so
    a row's running max moves mid-piece: past the kernels' conditional-rescale slack (2^8)
    at step 12 nearly every block, every other block at 6, every third at 3, and between
    moves P runs up to the slack.  The ramp is in the first rope column (column 512: key t
    holds t * delta there, every query 1): V, the first 512 columns, keeps its small values,
    so the output checks stay tight.  Pages past a sequence keep their NaN."""
    import torch

    delta = step / (64 * softmax_scale * math.log2(math.e))
    q = q.clone()
    q[..., 512] = 1.0
    k = k_cache.clone()
    page = k.shape[1]
    for b, n in enumerate(cache_seqlens.tolist()):
        if n == 0:
            continue
        t = torch.arange(n, device=k.device)
        pages = block_table[b, t // page].long()
        k[pages, t % page, 0, 512] = (t * delta).to(k.dtype)
    return q, k


def check_against_reference(out, lse, q, k_cache, block_table, cache_seqlens, softmax_scale,
                            causal, sharp=False):
    """Against the exact reference.  FlashMLA's data (sharp=False): FlashMLA's tolerances
    (out abs 8e-4 OR rel 2.01/128, cos-diff < 5e-6; lse abs 1e-6 OR rel 8.01/65536).

    Sharp data (randn, std 1: a few keys dominate each row): P in bf16/fp16 (as the tensor
    cores take it, in FlashMLA too) carries a relative error up to 2^-9 per probability, so
    an output element may be off by up to 2^-9 * max|V| before its own rounding; there the
    element bound is abs 2^-8 * max|V| OR rel 2.01/128, with the same cos-diff and lse checks."""
    ref_out, ref_lse = reference(q, k_cache, block_table, cache_seqlens, softmax_scale, causal)
    abs_tol = 8e-4
    if sharp:
        vmax = float(torch.nan_to_num(k_cache[..., :ref_out.shape[-1]].float(), 0.0).abs().max())
        abs_tol = max(abs_tol, vmax / 256)
    assert_close(out.float(), ref_out.to(out.dtype).float(), "out", abs_tol, 2.01 / 128, 5e-6)
    assert_close(lse, ref_lse, "lse", 1e-6, 8.01 / 65536)


def interleave(actors: list, inflight: list, land, rng, steps: int, deadlock: str) -> None:
    """Run the pipeline model's actors (generators, one step per `next`) and the landing of
    the copies in flight (`land(inflight entry)`, like a TMA completing) in a random order
    until all are done; a run that does not finish in `steps` is a deadlock."""
    for _ in range(steps):
        if not actors and not inflight:
            return
        if inflight and (not actors or rng.random() < 0.3):     # a copy lands
            land(inflight.pop(rng.randrange(len(inflight))))
            continue
        a = rng.choice(actors)
        try:
            next(a)
        except StopIteration:
            actors.remove(a)
    raise AssertionError(f"deadlock: {deadlock}")


def build_header_harness(directory: Path, source: str) -> ctypes.CDLL:
    """Compile a C++ harness over templates/hopper/include (the headers' host-side code,
    MLAGEN_HD) into a shared library with g++ and load it; skips the test without a
    compiler."""
    import pytest

    from mlagen.paths import TEMPLATES_DIR

    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("needs a C++ compiler")
    (directory / "h.cpp").write_text(source)
    subprocess.run([cxx, "-O2", "-std=c++17", "-shared", "-fPIC",
                    f"-I{TEMPLATES_DIR / 'hopper' / 'include'}", str(directory / "h.cpp"), "-o",
                    str(directory / "h.so")], check=True)
    return ctypes.CDLL(str(directory / "h.so"))
