"""Helpers for the verifier's tests: a tiny float64 attention-only reference and runners
built on it (a correct one and deliberately wrong ones), so the verifier can be tested
without a backend.  Runner factories are module-level: worker processes import them."""

from __future__ import annotations

import math

import torch

from mlagen.problem import MlaInputs, MlaOutputs


def tiny_reference(inp: MlaInputs, dtype=torch.float64, dv: int = 512,
                   scale_factor: float = 1.0, drop_last_key: bool = False,
                   round_out: bool = True) -> MlaOutputs:
    """Absorbed MLA decode, one sequence at a time, reading only the valid cache slots."""
    b, s_q, h, d = inp.q.shape
    page = inp.page_size
    out = torch.zeros(b, s_q, h, dv, dtype=dtype)
    lse = torch.full((b, h, s_q), math.inf, dtype=dtype)
    for i in range(b):
        n = int(inp.cache_seqlens[i])
        pages = max(1, -(-n // page))
        kv = inp.k_cache[inp.block_table[i, :pages].long()].reshape(-1, d)[:n].to(dtype)
        if drop_last_key and n > 0:
            kv = kv[:-1]
        L = kv.shape[0]
        q = inp.q[i].to(dtype)                                     # [s_q, h, d]
        s = torch.einsum("shd,ld->shl", q, kv) * inp.softmax_scale * scale_factor
        pos = n - s_q + torch.arange(s_q)                          # bottom-right causal
        visible = torch.arange(L)[None, :] <= pos[:, None]         # [s_q, L]
        s = s.masked_fill(~visible[:, None, :], -math.inf)
        m = torch.logsumexp(s, dim=-1)                             # [s_q, h]
        p = torch.exp(s - m[..., None]).nan_to_num(0.0)
        o = torch.einsum("shl,lv->shv", p, kv[:, :dv])
        none = ~visible.any(-1)                                    # rows that see nothing
        o[none] = 0
        m = torch.where(none[:, None], torch.full_like(m, math.inf), m)
        out[i] = o
        lse[i] = m.transpose(0, 1)
    if not round_out:
        return MlaOutputs(out=out, lse=lse)
    return MlaOutputs(out=out.to(inp.q.dtype), lse=lse.float())


def reference64(inp, dtype=torch.float64):
    """Called as mlagen.reference.run is: float64 out and lse, no rounding."""
    return tiny_reference(inp, dtype=dtype, round_out=False)


class RefRunner:
    """A correct "kernel": the reference rounded to the output dtype, into out= if given."""

    def __init__(self, **wrong):
        self.wrong = wrong

    def __call__(self, inp, out=None):
        r = tiny_reference(inp, **self.wrong)
        if out is None:
            return r
        out.out.copy_(r.out)
        out.lse.copy_(r.lse)
        return out


def ref_runner_factory(schedule):
    return RefRunner()


def crash_on_long_factory(schedule):
    """Kills its process (as an illegal memory access would) on any sequence over 100."""
    import os

    inner = RefRunner()

    def run(inp, out=None):
        if int(inp.cache_seqlens.max()) > 100:
            os._exit(17)
        return inner(inp, out=out)

    return run


def hopper_with_illegal_access_factory(schedule):
    """The hopper runner, except that a sequence over 100 keys first runs a kernel that
    writes far outside its buffer: an illegal memory access that poisons the CUDA context."""
    import torch
    import triton
    import triton.language as tl

    from mlagen import runner

    @triton.jit
    def _wild_store(ptr):
        tl.store(ptr + 0x10000000000, 1.0)

    inner = runner(schedule)

    def run(inp, out=None):
        if int(inp.cache_seqlens.max()) > 100:
            buf = torch.zeros(1, device="cuda")
            _wild_store[(1,)](buf)
            torch.cuda.synchronize()
        return inner(inp)

    return run


def wrong_on_whole_pieces_factory(schedule):
    """mlagen's reference as a "kernel" (out in the storage dtype, lse fp32), except under
    split_kv = 1 (a fault only whole-sequence pieces show), where its out is 1 % off: the
    worker must make a runner per run-time knob."""
    from mlagen.reference import run as reference
    from mlagen.verify.runner import expected_outputs

    factor = 1.01 if getattr(schedule.mapping, "split_kv", None) == 1 else 1.0

    def run(inp, out=None):
        # planted bad pages: NaN for those sequences, as the Hopper kernels' contract says
        r = expected_outputs(lambda i, dtype: reference(i, dtype), inp)
        o, lse = (r.out * factor).to(inp.q.dtype), r.lse.float()
        if out is None:
            return MlaOutputs(out=o, lse=lse)
        out.out.copy_(o)
        out.lse.copy_(lse)
        return out

    return run
