"""FlashMLA timed beside mlagen in the same process (`mlagen bench --flashmla LIB`).

The anchor files were measured on another day; on the device FlashMLA's own time drifts 1-8 %
against them with the device's power state on the day
(5569878:benchmarks/results/hopper_flashmla_same_visit_h200.md).
LIB is FlashMLA's April-2025 decode built into a plain shared library as
benchmarks/anchors/README.md describes: its kernels and a C shim of ours
(benchmarks/flashmla/shim.cu: `fm_metadata`, `fm_fwd`), no torch extension, so it loads
with ctypes.  The call
runs on an mlagen bench Caller's very tensors: q [b, s_q, h_q, 576], one KV head, page 64.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

from ...errors import MlagenError

_libs: dict[str, ctypes.CDLL] = {}
_vp, _i, _ll, _f = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong, ctypes.c_float
# the shim's C signatures (benchmarks/flashmla/shim.cu; a test holds the two together)
ARGTYPES = {
    "fm_metadata": [_vp, _vp, _vp, _i, _i, _vp],
    "fm_fwd": [_vp] * 6 + [_vp, _ll, _vp, _vp, _vp] + [_i] * 8 + [_f, _vp],
}


def load(path: str) -> ctypes.CDLL:
    """The library at path, with its two entry points typed; MlagenError if it cannot be."""
    if path in _libs:
        return _libs[path]
    if not Path(path).is_file():
        raise MlagenError(f"--flashmla {path}: no such file (how it is built: "
                          "benchmarks/anchors/README.md)")
    try:
        lib = ctypes.CDLL(str(Path(path).resolve()))
        for name, types in ARGTYPES.items():
            getattr(lib, name).argtypes = types
    except (OSError, AttributeError) as e:
        raise MlagenError(f"--flashmla {path}: not a FlashMLA library with "
                          f"the shim of benchmarks/flashmla/shim.cu ({e})") from None
    _libs[path] = lib
    return lib


def parts_for(sms: int, rows: int) -> int:
    """FlashMLA's num_sm_parts for one KV head: SMs over its 64-row tiles."""
    return max(1, sms // -(-rows // 64))


class FlashMLACall:
    """FlashMLA's get_mla_metadata once, then its decode call, on a Caller's tensors
    (causal as the bench's calls are; FlashMLA turns causal off at s_q = 1 itself)."""

    def __init__(self, lib: ctypes.CDLL, c):
        import torch

        self.lib = lib
        self.q, self.k, self.bt, self.seqlens = c.q, c.k, c.bt, c.seqlens
        if self.k.shape[1] != 64 or self.k.shape[2] != 1:   # before the GPU sees a wrong layout
            raise ValueError(f"FlashMLA takes one KV head in 64-token pages, not k_cache "
                             f"{tuple(self.k.shape)}")
        b, s_q, h_q, _ = self.q.shape
        self.shape = (b, s_q, h_q)
        dev = self.q.device
        self.parts = parts_for(torch.cuda.get_device_properties(dev).multi_processor_count,
                               s_q * h_q)
        self.md = torch.empty(self.parts, 8, dtype=torch.int32, device=dev)
        self.ns = torch.empty(b + 1, dtype=torch.int32, device=dev)
        self._check(lib.fm_metadata(self.seqlens.data_ptr(), self.md.data_ptr(),
                                    self.ns.data_ptr(), b, self.parts, self._stream()),
                    "get_mla_metadata")
        splits = b + self.parts
        self.lse_acc = torch.empty(splits, 1, s_q * h_q, dtype=torch.float32, device=dev)
        self.o_acc = torch.empty(splits, 1, s_q * h_q, 512, dtype=torch.float32, device=dev)

    @staticmethod
    def _stream() -> int:
        import torch

        return torch.cuda.current_stream().cuda_stream

    @staticmethod
    def _check(rc: int, what: str) -> None:
        if rc:
            raise RuntimeError(f"FlashMLA {what}: CUDA error {rc}")

    def __call__(self):
        import torch

        b, s_q, h_q = self.shape
        out = torch.empty(b, s_q * h_q, 1, 512, dtype=self.q.dtype, device=self.q.device)
        lse = torch.empty(b, 1, s_q * h_q, dtype=torch.float32, device=self.q.device)
        self._check(self.lib.fm_fwd(
            self.q.data_ptr(), self.k.data_ptr(), out.data_ptr(), lse.data_ptr(),
            self.lse_acc.data_ptr(), self.o_acc.data_ptr(), self.bt.data_ptr(),
            self.bt.stride(0), self.seqlens.data_ptr(), self.md.data_ptr(), self.ns.data_ptr(),
            self.parts, b, s_q, h_q, 1, self.k.shape[0], self.k.shape[1], 1, 576 ** -0.5,
            self._stream()), "decode")
        # one KV head: q's [b, s_q*h_q] rows are token-major already; lse to [b, h_q, s_q]
        return out.view(b, s_q, h_q, 512), lse.view(b, s_q, h_q).transpose(1, 2)
