"""FlashMLA (April-2025 release, built by build.sh into libflashmla.so) called on the same
tensors as mlagen's bench, so that both are timed in one visit (GPU only).

    FM_LIB=<dir>/libflashmla.so; FlashMLACaller(bench.Caller(...)) is called like it.
"""

from __future__ import annotations

import ctypes
import os

import torch

_lib = None


def lib():
    global _lib
    if _lib is None:
        path = os.environ.get("FM_LIB", "libflashmla.so")
        try:
            _lib = ctypes.CDLL(path)
        except OSError as e:
            raise RuntimeError(f"FM_LIB={path}: cannot load FlashMLA's library "
                               f"(build it with benchmarks/flashmla/build.sh): {e}") from None
        vp, i, ll, f = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong, ctypes.c_float
        _lib.fm_metadata.argtypes = [vp, vp, vp, i, i, vp]
        _lib.fm_fwd.argtypes = [vp] * 6 + [vp, ll, vp, vp, vp] + [i] * 8 + [f, vp]
    return _lib


def _check(rc: int, what: str) -> None:
    if rc:
        raise RuntimeError(f"FlashMLA {what}: CUDA error {rc}")


class FlashMLACaller:
    """FlashMLA's get_mla_metadata once, then its decode call, on an mlagen Caller's data."""

    def __init__(self, c):
        self.q, self.k, self.bt, self.seqlens = c.q, c.k, c.bt, c.seqlens
        b, s_q, h_q, d = self.q.shape
        self.shape = (b, s_q, h_q)
        sms = torch.cuda.get_device_properties(self.q.device).multi_processor_count
        self.parts = sms // max(1, -(-(s_q * h_q) // 64))
        dev = self.q.device
        self.md = torch.empty(self.parts, 8, dtype=torch.int32, device=dev)
        self.ns = torch.empty(b + 1, dtype=torch.int32, device=dev)
        _check(lib().fm_metadata(self.seqlens.data_ptr(), self.md.data_ptr(), self.ns.data_ptr(),
                                 b, self.parts, torch.cuda.current_stream().cuda_stream),
               "metadata")
        splits = b + self.parts
        self.lse_acc = torch.empty(splits, 1, s_q * h_q, dtype=torch.float32, device=dev)
        self.o_acc = torch.empty(splits, 1, s_q * h_q, 512, dtype=torch.float32, device=dev)

    def __call__(self):
        b, s_q, h_q = self.shape
        out = torch.empty(b, s_q * h_q, 1, 512, dtype=self.q.dtype, device=self.q.device)
        lse = torch.empty(b, 1, s_q * h_q, dtype=torch.float32, device=self.q.device)
        _check(lib().fm_fwd(self.q.data_ptr(), self.k.data_ptr(), out.data_ptr(), lse.data_ptr(),
                            self.lse_acc.data_ptr(), self.o_acc.data_ptr(), self.bt.data_ptr(),
                            self.bt.stride(0), self.seqlens.data_ptr(), self.md.data_ptr(),
                            self.ns.data_ptr(), self.parts, b, s_q, h_q, 1, self.k.shape[0],
                            self.k.shape[1], 1, 576 ** -0.5,
                            torch.cuda.current_stream().cuda_stream), "decode")
        # h_k = 1: q's [b, s_q*h_q] rows are token-major already; lse back to [b, h_q, s_q]
        return (out.view(b, s_q, h_q, 512),
                lse.view(b, s_q, h_q).transpose(1, 2))
