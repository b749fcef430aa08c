"""The kernel libraries (built once through mlagen.jit, loaded once per process) and the
torch ops over them (torch.library.custom_op + register_fake), so the calls work under
torch.compile and inside CUDA-graph capture.

A library is named by a key (its canonical variant name); the ops take that key as a string
argument and find the loaded library in a registry here.  The eager calls' per-signature
cache and its miss path are api.py's; this module is the library and the launch.
"""

from __future__ import annotations

import ctypes
import math
import threading
from typing import Optional

import torch

from mlagen.errors import InputError
from mlagen.schedule.plan import Plan

from . import scheduler
from .abi import EXTRA_FIELDS, KV_CODE, SHAPE_FIELDS, extra_array, shape_array

_LOCK = threading.Lock()
_LIBS: dict[str, "KernelLib"] = {}
_SMS: dict[int, int] = {}

P, I, F, LL = ctypes.c_void_p, ctypes.c_int, ctypes.c_float, ctypes.c_longlong


class KernelLib:
    """One built variant: its ctypes entry points and the constants it was built with."""

    def __init__(self, plan: Plan):
        from mlagen.jit import load

        schedule = plan.schedule
        self.schedule = schedule
        self.artifact, lib = load(plan.backend.render(plan), origin=schedule)
        lib.mlagen_hopper_error_string.restype = ctypes.c_char_p
        lib.mlagen_hopper_error_string.argtypes = [I]
        lib.mlagen_hopper_metadata.restype = I
        lib.mlagen_hopper_metadata.argtypes = [P, I, I, I, I, P, P, P]
        lib.mlagen_hopper_sparse_lengths.restype = I
        lib.mlagen_hopper_sparse_lengths.argtypes = [P, P, I, I, I, I, P, P, P]
        # a two-pool sparse variant has its own entry (the extra pool's arguments after
        # the decode's), so that neither entry can be called for the other's kernel
        p = schedule.problem
        self.extra_pool = p.attention == "sparse" and p.extra_topk > 0
        if self.extra_pool:
            lib.mlagen_hopper_decode_pools.restype = I
            lib.mlagen_hopper_decode_pools.argtypes = (
                [ctypes.POINTER(LL)] + [P] * 13 + [F, P] + [ctypes.POINTER(LL), P, P, P])
        else:
            lib.mlagen_hopper_decode.restype = I
            lib.mlagen_hopper_decode.argtypes = ([ctypes.POINTER(LL)] + [P] * 13 + [F, P])
        self.lib = lib
        self._ctas_per_sm: int | None = None
        self.rows_per_tile = lib.mlagen_hopper_rows_per_tile()
        if self.rows_per_tile != schedule.mapping.rows_per_tile:
            raise RuntimeError(f"library {self.artifact.path} was built for "
                               f"{self.rows_per_tile} rows, expected "
                               f"{schedule.mapping.rows_per_tile}")
        self.kv_format = schedule.problem.kv
        if lib.mlagen_hopper_kv_format() != KV_CODE[self.kv_format]:
            raise RuntimeError(f"library {self.artifact.path} reads KV format code "
                               f"{lib.mlagen_hopper_kv_format()}, expected "
                               f"{KV_CODE[self.kv_format]} ({self.kv_format})")

    def ctas_per_sm(self) -> int:
        """Split-kernel CTAs that fit on one SM (asked of the CUDA runtime once)."""
        if self._ctas_per_sm is None:
            n = self.lib.mlagen_hopper_ctas_per_sm()
            if n <= 0:
                self.check(-n or 1, "occupancy query")
            self._ctas_per_sm = n
        return self._ctas_per_sm

    def cluster_parts(self, parts: int) -> int:
        """At most `parts`: a sparse call's parts when its kernel runs in clusters of a
        token's two row tiles, which must all fit at once (the CUDA runtime's count)."""
        return self.lib.mlagen_hopper_cluster_parts(parts)

    def check(self, code: int, what: str) -> None:
        if code != 0:
            msg = self.lib.mlagen_hopper_error_string(code).decode()
            raise RuntimeError(f"mlagen hopper {what}: CUDA error {code}: {msg}")


def library(plan: Plan) -> str:
    """Build (cached) and load the library of a canonical schedule's checked plan; returns
    its key."""
    key = plan.variant
    with _LOCK:
        if key not in _LIBS:
            _LIBS[key] = KernelLib(plan)
    return key


def get(key: str) -> KernelLib:
    try:
        return _LIBS[key]
    except KeyError:
        raise InputError(f"no hopper kernel library {key!r} is loaded in this process") from None


def sm_count(device: torch.device) -> int:
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SMS:
        _SMS[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SMS[idx]


# --------------------------------------------------------------------------- metadata ----
def get_mla_metadata_impl(cache_seqlens: torch.Tensor, num_parts: int, fixed_splits: int,
                          kernel: str, split_cost: int = scheduler.FIXED_COST
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    lib = get(kernel)
    b = cache_seqlens.shape[0]
    dev = cache_seqlens.device
    idx = cache_seqlens.get_device()
    if torch.cuda.current_device() != idx:
        with torch.cuda.device(idx):
            return get_mla_metadata_impl(cache_seqlens, num_parts, fixed_splits, kernel,
                                         split_cost)
    sched = torch.empty(num_parts, scheduler.META_INTS, dtype=torch.int32, device=dev)
    num_splits = torch.empty(b + 1, dtype=torch.int32, device=dev)
    code = lib.lib.mlagen_hopper_metadata(cache_seqlens.data_ptr(), b, num_parts,
                                          split_cost, fixed_splits,
                                          sched.data_ptr(), num_splits.data_ptr(),
                                          _raw_stream(idx))
    if code:
        lib.check(code, "scheduler launch")
    return sched, num_splits


class MetadataPlan:
    """get_mla_metadata for one cache_seqlens signature and split: its arguments to
    get_mla_metadata_impl, and the C++ call path (attach_fast) once the caller has one."""

    __slots__ = ("args", "idx", "fast", "tail")

    def __init__(self, cache_seqlens: torch.Tensor, num_parts: int, fixed_splits: int,
                 kernel: str, split_cost: int):
        self.args = (num_parts, fixed_splits, kernel, split_cost)
        self.idx = cache_seqlens.get_device()
        self.fast = None
        self.tail = None

    def run(self, cache_seqlens):
        return get_mla_metadata_impl(cache_seqlens, *self.args)

    def attach_fast(self, like: torch.Tensor, tail: tuple) -> None:
        """The C++ path for cache_seqlens of like's signature and the other arguments tail
        (num_heads_per_head_k, num_heads_k, schedule)."""
        from . import fastcall

        num_parts, fixed_splits, kernel, split_cost = self.args
        self.fast = fastcall.metadata_plan(like, get(kernel).lib, num_parts, fixed_splits,
                                           split_cost)
        self.tail = tail

    def run_fast(self, cache_seqlens):
        """(metadata, num_splits) through the C++ path, or None (another signature, another
        device current, a graph being captured: the Python path)."""
        if _get_device() != self.idx or _capturing():
            return None
        try:
            return self.fast.run(cache_seqlens, _raw_stream(self.idx))
        except TypeError:      # not a tensor: the Python path's checks say so
            return None


# The torch ops: what torch.compile traces.  Eager calls go to the *_impl functions directly
# (api.py), skipping the dispatcher's tens of microseconds per call.
get_mla_metadata_op = torch.library.custom_op("mlagen_hopper::get_mla_metadata",
                                              get_mla_metadata_impl, mutates_args=())


@get_mla_metadata_op.register_fake
def _(cache_seqlens, num_parts, fixed_splits, kernel, split_cost=scheduler.FIXED_COST):
    b = cache_seqlens.shape[0]
    return (cache_seqlens.new_empty((num_parts, scheduler.META_INTS)),
            cache_seqlens.new_empty((b + 1,)))


# --------------------------------------------------------------------------- decode ------
STRICT = False   # api sets it from MLAGEN_HOPPER_STRICT: check indices on the host (a sync)

_ERRORS: dict[int, torch.Tensor] = {}
_WORKSPACES: dict[tuple[int, int], torch.Tensor] = {}
SHAPE_INTS = len(SHAPE_FIELDS)   # the C entry's shape[] (abi.py; read by api.cu.j2)


def error_flags(device: torch.device) -> torch.Tensor:
    """The device's int32[1] error flags that the split kernel sets (kError* in
    mla_common.cuh); made once per device, zero until a kernel finds a bad input."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    t = _ERRORS.get(idx)
    if t is None:
        t = _ERRORS[idx] = torch.zeros(1, dtype=torch.int32, device=torch.device("cuda", idx))
    return t


def _raw_stream(idx: int) -> int:
    return torch.cuda.current_stream(idx).cuda_stream


try:   # the current stream's handle without building a torch.cuda.Stream object
    _raw_stream = torch._C._cuda_getCurrentRawStream     # noqa: F811
except AttributeError:   # pragma: no cover - older torch
    pass


def _get_device() -> int:
    return torch.cuda.current_device()


try:   # the C function behind it, without the lazy-init wrapper (once per call)
    _get_device = torch._C._cuda_getDevice     # noqa: F811
except AttributeError:   # pragma: no cover - older torch
    pass


def _capturing() -> bool:
    return torch.cuda.is_current_stream_capturing()


try:   # the C function behind it, without the Python wrapper's checks (once per call)
    _capturing = torch._C._cuda_isCurrentStreamCapturing     # noqa: F811
except AttributeError:   # pragma: no cover - older torch
    pass


def check_indices(k_cache, block_table, cache_seqlens) -> None:
    """Strict mode: seqlens within the table's capacity and the pages they use within the
    cache, checked on the host (one sync).  Skipped while a CUDA graph is being captured.
    By default the kernel checks instead: NaN for that sequence and the error flag set."""
    page = k_cache.shape[1]
    max_blocks = block_table.shape[1]
    lens = cache_seqlens.long()
    used = (lens + page - 1).clamp(min=0) // page
    cols = torch.arange(max_blocks, device=block_table.device)
    in_use = cols[None, :] < used[:, None]
    bad_page = ((block_table < 0) | (block_table >= k_cache.shape[0])) & in_use
    bad_len = (lens < 0) | (lens > max_blocks * page)
    flags = torch.stack([bad_len.any(), bad_page.any()]).cpu()
    if flags[0]:
        i = int(torch.nonzero(bad_len)[0])
        raise InputError(f"cache_seqlens[{i}] = {int(lens[i])} is outside [0, {max_blocks * page}]"
                         f" (block_table has {max_blocks} pages of {page} tokens per sequence)")
    if flags[1]:
        r, c = (int(x) for x in torch.nonzero(bad_page)[0])
        raise InputError(f"block_table[{r}, {c}] = {int(block_table[r, c])} is outside "
                         f"[0, {k_cache.shape[0]}) (num_blocks of k_cache) but sequence {r} "
                         f"uses that page")


def extra_shape(extra_k_cache: torch.Tensor, extra_topk: int):
    """The two-pool entry's extra_shape[] (abi.EXTRA_FIELDS) for a second pool's cache and
    its index lists flattened to [rows, extra_topk] (contiguous rows)."""
    return (LL * len(EXTRA_FIELDS))(*extra_array(
        k2_stride_block=extra_k_cache.stride(0), k2_stride_token=extra_k_cache.stride(1),
        idx2_stride=extra_topk, page_size2=extra_k_cache.shape[1],
        num_blocks2=extra_k_cache.shape[0]))


def _dense(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """A [b] length vector with its elements one int apart (a strided view copied; the
    caller keeps the copy until the launch, or the allocator may hand its memory to the
    next copy), or None."""
    if t is not None and t.dim() == 1 and t.shape[0] > 1 and t.stride(0) != 1:
        return t.contiguous()
    return t


class DecodePlan:
    """What stays fixed for one call signature (shapes, strides, dtypes, devices, scale,
    causal, kernel): the checked sizes and the C entry's shape[] array, so that a repeated
    call only reads pointers, allocates its outputs and launches."""

    __slots__ = ("lib", "idx", "device", "out_shape", "lse_shape", "ws_numel",
                 "shape", "scale_log2", "error", "fast", "tail")

    def __init__(self, q, k_cache, block_table, parts: int, softmax_scale: float,
                 causal: bool, kernel: str, k_descale=None, q_descale=None):
        self.lib = get(kernel)
        b, s_q, h_q, _ = q.shape
        self.device = q.device
        self.idx = q.get_device()
        rows_total = s_q * h_q
        self.out_shape = (b, s_q, h_q, 512)
        self.lse_shape = (b, h_q, s_q)
        slots = b + parts     # each part adds at most one split beyond one per request
        o_numel = slots * rows_total * 512
        self.ws_numel = o_numel + slots * rows_total
        self.shape = (LL * SHAPE_INTS)(*shape_array(
            q_stride_b=q.stride(0), q_stride_s=q.stride(1), q_stride_h=q.stride(2),
            k_stride_block=k_cache.stride(0), k_stride_token=k_cache.stride(1),
            # one descale, or one a sequence (api checks the shapes: [1] or [b])
            k_descale_stride=int(k_descale is not None and k_descale.numel() > 1),
            q_descale_stride=int(q_descale is not None and q_descale.numel() > 1),
            bt_stride=block_table.stride(0), batch=b, s_q=s_q, h_q=h_q,
            page_size=k_cache.shape[1], num_blocks=k_cache.shape[0],
            max_blocks=block_table.shape[1], num_parts=parts, causal=int(causal),
            num_sms=sm_count(self.device), lse_offset=o_numel))
        self.scale_log2 = softmax_scale * math.log2(math.e)
        self.error = error_flags(self.device).data_ptr()
        self.fast = None     # the C++ call path (attach_fast)
        self.tail = None     # the call's other arguments it was attached for

    def attach_fast(self, like: list, tail: tuple) -> None:
        """Give this plan the C++ call path (fastcall.py) for calls with exactly the tensors'
        signature of `like` (q, k_cache, block_table, cache_seqlens, metadata, num_splits)
        and the other arguments `tail` (head_dim_v, softmax_scale, causal, schedule)."""
        from . import fastcall

        self.fast = fastcall.decode_plan(like, self.lib.lib, self.shape, self.out_shape,
                                         self.lse_shape, self.ws_numel, self.error,
                                         self.scale_log2)
        self.tail = tail

    def run_fast(self, q, k_cache, block_table, cache_seqlens, sched, num_splits):
        """(out, lse) through the C++ path, or None when this call is not the plan's exact
        signature, another device is current, a graph is being captured or the stream has
        no workspace yet (the caller's Python path handles each)."""
        if _get_device() != self.idx or _capturing():
            return None
        stream = _raw_stream(self.idx)
        ws = _WORKSPACES.get((self.idx, stream))
        if ws is None:
            return None
        try:
            return self.fast.run(q, k_cache, block_table, cache_seqlens, sched, num_splits,
                                 stream, ws)
        except TypeError:      # not tensors: the Python path's checks say what is wrong
            return None

    def sparse_lengths(self, topk_length, extra_topk_length, s_q: int, topk: int,
                       extra_topk: int) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """A sparse call's (each flattened row's key count, its main-list length or None for
        one pool) from FlashMLA's int32 [b] lengths (None: topk) in one launch on the
        current stream (mla_sparse_lengths_kernel), for the rows of this plan's flattened
        q; new contiguous tensors, which the scheduler and the kernel read by pointer."""
        if _get_device() != self.idx:
            with torch.cuda.device(self.idx):
                return self.sparse_lengths(topk_length, extra_topk_length, s_q, topk,
                                           extra_topk)
        rows = self.out_shape[0]
        buf = torch.empty(2 * rows if extra_topk else rows, dtype=torch.int32,
                          device=self.device)
        tl, xl = _dense(topk_length), _dense(extra_topk_length)
        code = self.lib.lib.mlagen_hopper_sparse_lengths(
            None if tl is None else tl.data_ptr(), None if xl is None else xl.data_ptr(),
            rows, s_q, topk, extra_topk,
            buf.data_ptr(), buf.data_ptr() + 4 * rows if extra_topk else None,
            _raw_stream(self.idx))
        if code:
            self.lib.check(code, "sparse lengths launch")
        return (buf[:rows], buf[rows:]) if extra_topk else (buf, None)

    def workspace(self, stream: int) -> torch.Tensor:
        """Partial O (fp32, or fp16 then its scales in the same floats: the 64-row wgmma
        kernel, api.cu.j2), then partial lse.  Eager calls reuse one per (device, stream):
        calls on one stream run in order, so the next split cannot overwrite what the
        previous combine still reads.  A CUDA-graph capture gets its own (from the graph's
        pool), since its replays may run beside eager calls."""
        if _capturing():
            return torch.empty(self.ws_numel, dtype=torch.float32, device=self.device)
        key = (self.idx, stream)
        ws = _WORKSPACES.get(key)
        if ws is None or ws.numel() < self.ws_numel:
            ws = _WORKSPACES[key] = torch.empty(self.ws_numel, dtype=torch.float32,
                                                device=self.device)
        return ws

    def run(self, q, k_cache, block_table, cache_seqlens, sched, num_splits, out=None,
            lse=None, k_descale=None, q_descale=None, sink=None, extra=None
            ) -> tuple[torch.Tensor, torch.Tensor]:
        """extra: a two-pool sparse variant's (extra_shape, extra cache, its index lists
        [rows, extra_topk], each row's main-list length), None for every other."""
        qp, kp = q.data_ptr(), k_cache.data_ptr()
        if kp % 16:
            raise InputError("k_cache's data must start on a 16-byte boundary")
        if (extra is not None) != self.lib.extra_pool:
            raise InputError(f"kernel {self.lib.schedule.name!r} reads "
                             f"{'two pools' if self.lib.extra_pool else 'one pool'} of keys, "
                             f"this call {'two' if extra is not None else 'one'}")
        if extra is not None and extra[1].data_ptr() % 16:
            raise InputError("extra_k_cache's data must start on a 16-byte boundary")
        if qp % 16:
            q = q.clone()                # 16-byte aligned rows for cp.async
            qp = q.data_ptr()
        if torch.cuda.current_device() != self.idx:
            with torch.cuda.device(self.idx):
                return self.run(q, k_cache, block_table, cache_seqlens, sched, num_splits,
                                out, lse, k_descale, q_descale, sink, extra)
        # new_empty: q's dtype and device without parsing them again (~0.5 us a tensor)
        if out is None:
            out = q.new_empty(self.out_shape)
        if lse is None:
            lse = q.new_empty(self.lse_shape, dtype=torch.float32)
        stream = _raw_stream(self.idx)
        ws = self.workspace(stream)
        args = (self.shape, qp, kp, None if k_descale is None else k_descale.data_ptr(),
                None if q_descale is None else q_descale.data_ptr(),
                None if sink is None else sink.data_ptr(),
                block_table.data_ptr(), cache_seqlens.data_ptr(),
                sched.data_ptr(), num_splits.data_ptr(), out.data_ptr(), lse.data_ptr(),
                ws.data_ptr(), self.error, self.scale_log2, stream)
        if extra is None:
            code = self.lib.lib.mlagen_hopper_decode(*args)
        else:
            xs, k2, idx2, len1 = extra
            code = self.lib.lib.mlagen_hopper_decode_pools(
                *args, xs, k2.data_ptr(), idx2.data_ptr(), len1.data_ptr())
        if code:
            self.lib.check(code, "decode launch")
        return out, lse


def mla_decode_impl(q: torch.Tensor, k_cache: torch.Tensor, block_table: torch.Tensor,
                    cache_seqlens: torch.Tensor, sched: torch.Tensor, num_splits: torch.Tensor,
                    softmax_scale: float, causal: bool, kernel: str,
                    k_descale: Optional[torch.Tensor] = None,
                    q_descale: Optional[torch.Tensor] = None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    return decode_into(q, k_cache, block_table, cache_seqlens, sched, num_splits,
                       softmax_scale, causal, kernel, k_descale=k_descale, q_descale=q_descale)


def decode_into(q, k_cache, block_table, cache_seqlens, sched, num_splits, softmax_scale,
                causal, kernel, out=None, lse=None, k_descale=None, q_descale=None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """The launch without a cached plan (torch.compile's op, out=); writes into `out`/`lse`
    when given (the verifier poisons them first so an element the kernel never writes is
    caught), else allocates them."""
    if STRICT and not _capturing():
        check_indices(k_cache, block_table, cache_seqlens)
    plan = DecodePlan(q, k_cache, block_table, sched.shape[0], softmax_scale, causal, kernel,
                      k_descale, q_descale)
    return plan.run(q, k_cache, block_table, cache_seqlens, sched, num_splits, out, lse,
                    k_descale, q_descale)


mla_decode_op = torch.library.custom_op("mlagen_hopper::mla_decode", mla_decode_impl,
                                        mutates_args=())


@mla_decode_op.register_fake
def _(q, k_cache, block_table, cache_seqlens, sched, num_splits, softmax_scale, causal, kernel,
      k_descale=None, q_descale=None):
    b, s_q, h_q, _ = q.shape
    return (q.new_empty((b, s_q, h_q, 512)),
            q.new_empty((b, h_q, s_q), dtype=torch.float32))
