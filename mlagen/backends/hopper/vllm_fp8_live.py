"""vLLM's dense FP8 MLA decode timed beside mlagen in the same process
(`mlagen bench [--shape ...] --kv-format fp8_e4m3 --vllm-fp8 LIB`).

LIB is the torch extension of vLLM's FlashMLA fork (github.com/vllm-project/FlashMLA,
`csrc/extension/sm90/dense_fp8/`: pybind.cpp, flash_fwd_mla_fp8_sm90.cu,
flash_fwd_mla_metadata.cu, compiled with -DNO_PYBIND11=1 against CUTLASS e94e888 for sm_90a,
benchmarks/anchors/README.md).  It exports ``get_mla_decoding_metadata_dense_fp8`` and
``fwd_kvcache_mla_fp8``: q and the cache both e4m3, one descale each for the whole tensor
(its pybind.cpp checks both descales are of shape (1)), one KV head in 64-token pages.  The
call runs on an mlagen bench Caller's fp8_e4m3 cache (the very bytes ours reads); its q is
the Caller's bf16 q quantized with one scale (amax / 448), the kernel's own input
convention, so its answer is checked against the reference on that dequantized q.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from ...errors import MlagenError

ENTRY_POINTS = ("get_mla_decoding_metadata_dense_fp8", "fwd_kvcache_mla_fp8")
_mods: dict = {}


def load(path: str):
    """The extension module at path; MlagenError (one line) if it is not one with both entry
    points."""
    if path in _mods:
        return _mods[path]
    p = Path(path)
    if not p.is_file():
        raise MlagenError(f"--vllm-fp8 {path}: no such file (what it is: "
                          "benchmarks/anchors/README.md)")
    import torch  # noqa: F401  (the extension links against torch's libraries)

    try:
        spec = importlib.util.spec_from_file_location(p.name.split(".")[0], str(p.resolve()))
        if spec is None or spec.loader is None:
            raise ImportError("not an extension module")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        for name in ENTRY_POINTS:
            getattr(mod, name)
    except (ImportError, OSError, AttributeError) as e:
        raise MlagenError(f"--vllm-fp8 {path}: not vLLM's dense FP8 FlashMLA extension "
                          f"({str(e).splitlines()[0][:120]})") from None
    _mods[path] = mod
    return mod


class VllmFp8Call:
    """Its metadata once, then its decode call, on a Caller with an fp8_e4m3 cache."""

    def __init__(self, mod, c):
        import torch

        from ... import kvformat

        if getattr(c, "kv", "") != "fp8_e4m3":
            raise ValueError("vLLM's dense FP8 kernel reads fp8_e4m3 caches only")
        if c.k.shape[1] != 64 or c.k.shape[2] != 1:
            raise ValueError(f"vLLM's dense FP8 kernel takes one KV head in 64-token pages, "
                             f"not k_cache {tuple(c.k.shape)}")
        self.mod, self.k, self.bt, self.seqlens = mod, c.k, c.bt, c.seqlens
        b, s_q, h_q, _ = c.q.shape
        # one descale for the whole q and one for the cache: the fork's pybind.cpp checks
        # both are of shape (1) (CHECK_SHAPE(descale_q_, 1))
        amax = c.q.float().abs().amax().clamp(min=1e-12).reshape(1)
        self.descale_q = (amax / kvformat.E4M3_MAX).contiguous()
        self.q8 = (c.q.float() / self.descale_q).to(torch.float8_e4m3fn)
        # the q this kernel computes with, for the reference (check_output reads c.q)
        self.q = (self.q8.float() * self.descale_q).to(c.q.dtype)
        self.descale_k = c.descale.reshape(1).contiguous().float()
        self.kv, self.descale = c.kv, c.descale
        self.md, self.ns = mod.get_mla_decoding_metadata_dense_fp8(c.seqlens, s_q * h_q, 1)

    def __call__(self):
        return self.mod.fwd_kvcache_mla_fp8(self.q8, self.k, 512, self.seqlens, self.bt,
                                            576 ** -0.5, True, self.md, self.ns,
                                            self.descale_q, self.descale_k)
