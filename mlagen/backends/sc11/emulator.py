"""The SC11 emulator kernel, built and loaded: ctypes over its C ABI, torch tensors in and
out (the package's __init__ loads this module on first use: it imports torch and numpy).

    runner(schedule)  -> Sc11Runner  callable: MlaInputs -> MlaOutputs (+ trace, scheme,
                                     LMEM / L2 high-water marks in ``extra``)

The kernel library has a plain C ABI (templates/sc11/runtime/abi.h): one call runs the
whole operator on the emulated chip, in compute mode (real data) or dry mode (same control
flow and trace, no data work; what the scheme chooser simulates).
"""

from __future__ import annotations

import ctypes
import functools
from typing import Optional

import numpy as np
import torch

from ... import kvformat
from ...jit import load
from ...errors import EmulatorError, InputError
from ...problem import TORCH_DTYPES, MlaInputs, MlaOutputs, SparseInputs
from ...reference import weights_rope
from ...rope import RopeConfig, RotaryTable
from ...schedule.plan import Plan
from ...schedule.rules import plan_of
from ...schedule.records import Schedule
from .sources import render
from .trace import EVENT_DTYPE

# Scheme names -> the C ABI's numbers (templates/sc11/runtime/plan.h).
SCHEME_IDS = {"heads": 1, "batch": 2, "seq": 3, "batch_seq": 4}


class _Args(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int64) for n in
                ("batch", "s_q", "num_blocks", "max_blocks", "scheme", "causal", "threads")] + \
               [("scale", ctypes.c_double), ("rope_rows", ctypes.c_int64),
                ("rope_layout", ctypes.c_int64), ("rope_cos", ctypes.c_void_p),
                ("rope_sin", ctypes.c_void_p)] + \
               [(n, ctypes.c_void_p) for n in
                ("q", "q_lora", "w_uq", "w_uk", "w_uv", "k_cache", "block_table", "seqlens",
                 "out", "lse")] + \
               [("k_descale", ctypes.c_void_p), ("descale_n", ctypes.c_int64)] + \
               [(n, ctypes.c_void_p) for n in
                ("indices", "topk_length", "extra_k_cache", "extra_indices",
                 "extra_topk_length")] + \
               [("extra_num_blocks", ctypes.c_int64), ("attn_sink", ctypes.c_void_p)]


class _Result(ctypes.Structure):
    _fields_ = [("events", ctypes.c_void_p)] + [(n, ctypes.c_int64) for n in
                ("n_events", "lmem_high", "l2_high", "l2_static", "lmem_capacity",
                 "l2_capacity", "n_parts", "copied_bytes")]


def _p(t: Optional[torch.Tensor]) -> Optional[int]:
    return None if t is None else t.data_ptr()


class Sc11Runner:
    """A built SC11 variant.  ``runner(inputs, scheme=None)`` runs it on real data;
    ``dry_run(inputs, scheme)`` returns the trace alone (no data work)."""

    def __init__(self, plan: Plan | Schedule, progress: Optional[bool] = None):
        self.plan = plan = plan_of(plan)
        self.schedule = schedule = plan.schedule
        self.target = plan.target
        self.artifact, lib = load(render(plan), progress=progress, origin=schedule)
        lib.mlagen_sc11_run.argtypes = [ctypes.POINTER(_Args), ctypes.c_int,
                                        ctypes.POINTER(_Result), ctypes.c_char_p, ctypes.c_int]
        lib.mlagen_sc11_run.restype = ctypes.c_int
        lib.mlagen_sc11_free.argtypes = [ctypes.POINTER(_Result)]
        lib.mlagen_sc11_event_size.restype = ctypes.c_int64
        lib.mlagen_sc11_variant.restype = ctypes.c_char_p
        if lib.mlagen_sc11_event_size() != EVENT_DTYPE.itemsize:
            raise EmulatorError("the kernel's trace event layout does not match EVENT_DTYPE")
        self.lib = lib

    # ---- checks ------------------------------------------------------------------------
    def validate(self, inp: MlaInputs | SparseInputs) -> None:
        """Raise InputError for anything the kernel cannot run on (before any run)."""
        s, p = self.schedule, self.schedule.problem
        if (p.attention == "sparse") != isinstance(inp, SparseInputs):
            raise InputError(f"{s.variant_name()}: attention = {p.attention!r} takes "
                             f"{'SparseInputs' if p.attention == 'sparse' else 'MlaInputs'}, "
                             f"got {type(inp).__name__}")
        if isinstance(inp, SparseInputs):
            from .sparse import validate_sparse

            return validate_sparse(s, inp)
        dt = TORCH_DTYPES[p.dtype]
        h = s.heads_per_device

        def need(cond: bool, msg: str) -> None:
            if not cond:
                raise InputError(f"{s.variant_name()}: {msg}")

        def tensor(name: str, t, shape: tuple, dtype) -> None:
            need(isinstance(t, torch.Tensor), f"{name} must be a tensor")
            need(t.device.type == "cpu", f"{name} is on {t.device}; the emulator runs on the CPU")
            need(t.dtype == dtype, f"{name} has dtype {t.dtype}; the schedule says {dtype}")
            need(tuple(t.shape) == shape, f"{name} has shape {tuple(t.shape)}; expected {shape}")

        bt, sl = inp.block_table, inp.cache_seqlens
        need(isinstance(bt, torch.Tensor), "block_table must be a tensor")
        need(bt.dim() == 2, f"block_table has shape {tuple(bt.shape)}; expected "
                            "[batch, max_blocks]")
        b, max_blocks = bt.shape
        need(b >= 1 and max_blocks >= 1, "block_table must have at least one row and column")
        tensor("block_table", bt, (b, max_blocks), torch.int32)
        tensor("cache_seqlens", sl, (b,), torch.int32)
        kc = inp.k_cache
        fmt = kvformat.get(p.kv)
        width = fmt.width(p.kv_lora_rank, p.rope_dim)
        need(isinstance(kc, torch.Tensor), "k_cache must be a tensor")
        need(kc.dim() == 4, f"k_cache has shape {tuple(kc.shape)}; expected "
                            f"[num_blocks, {p.page_size}, 1, {width}]")
        need(kc.shape[1] == p.page_size,
             f"k_cache page size {kc.shape[1]} differs from the schedule's page_size {p.page_size}")
        need(inp.kv_format in ("", p.kv),
             f"the inputs' cache is {inp.kv_format}; the schedule's kv_format is {p.kv}")
        if fmt.quantized:
            need(kc.dtype in (kvformat.FP8, torch.uint8),
                 f"k_cache has dtype {kc.dtype}; a {p.kv} cache is float8_e4m3fn (or uint8) "
                 f"[num_blocks, page, 1, {width}]")
            tensor("k_cache", kc, (kc.shape[0], p.page_size, 1, width), kc.dtype)
        else:
            tensor("k_cache", kc, (kc.shape[0], p.page_size, 1, p.d), dt)
        try:
            kvformat.check_descale(inp.k_descale, p.kv, b, torch.device("cpu"))
        except InputError as e:
            need(False, str(e))
        if p.fused:
            need(inp.q_lora is not None and inp.weights is not None,
                 "the fused operator needs q_lora and weights (got q)")
            need(isinstance(inp.q_lora, torch.Tensor), "q_lora must be a tensor")
            need(inp.q_lora.dim() == 3, f"q_lora has shape {tuple(inp.q_lora.shape)}; "
                                        f"expected [batch, s_q, {p.q_lora_rank}]")
            s_q = inp.q_lora.shape[1]
            need(1 <= s_q <= p.max_s_q, f"s_q = {s_q} must be between 1 and max_s_q = {p.max_s_q}")
            tensor("q_lora", inp.q_lora, (b, s_q, p.q_lora_rank), dt)
            w = inp.weights
            tensor("w_uq", w.w_uq, (p.q_lora_rank, h, p.qk_nope_head_dim + p.rope_dim), dt)
            tensor("w_uk", w.w_uk, (h, p.qk_nope_head_dim, p.kv_lora_rank), dt)
            tensor("w_uv", w.w_uv, (h, p.kv_lora_rank, p.v_head_dim), dt)
        else:
            need(inp.q is not None, "attention-only needs q [batch, s_q, heads, d]")
            need(isinstance(inp.q, torch.Tensor), "q must be a tensor")
            need(inp.q.dim() == 4, f"q has shape {tuple(inp.q.shape)}; expected "
                                   f"[batch, s_q, {h}, {p.d}]")
            s_q = inp.q.shape[1]
            need(1 <= s_q <= p.max_s_q, f"s_q = {s_q} must be between 1 and max_s_q = {p.max_s_q}")
            tensor("q", inp.q, (b, s_q, h, p.d), dt)
        need(inp.softmax_scale is not None and inp.softmax_scale > 0, "softmax_scale must be > 0")
        cap = max_blocks * p.page_size
        bad = ((sl < 0) | (sl > cap)).nonzero().flatten()
        if len(bad):
            i = int(bad[0])
            need(False, f"cache_seqlens[{i}] = {int(sl[i])} must be in [0, {cap}] "
                        f"(block_table holds {max_blocks} pages of {p.page_size})")
        # every page a sequence uses must exist (entries past its length are never read)
        pages = (sl.long() + p.page_size - 1) // p.page_size
        used = torch.arange(max_blocks)[None, :] < pages[:, None]
        nb = kc.shape[0]
        wrong = used & ((bt < 0) | (bt >= nb))
        if wrong.any():
            i, j = (int(x) for x in wrong.nonzero()[0])
            need(False, f"block_table[{i}, {j}] = {int(bt[i, j])} is not a page of k_cache "
                        f"[0, {nb}) but sequence {i} uses it")

    def resolve_scheme(self, inp: MlaInputs, scheme: Optional[str]) -> str:
        """A concrete scheme: the given one, the schedule's, or auto's pick for `inp`."""
        return self._resolve(inp, scheme)[0]

    def _resolve(self, inp: MlaInputs, scheme: Optional[str]) -> tuple[str, dict]:
        scheme = scheme or self.schedule.mapping.scheme
        if scheme == "auto":
            from .schemes import choose_scheme

            picked, times = choose_scheme(self.schedule, inp,
                                          lambda sc: self.dry_run(inp, sc, validate=False))
            return picked, dict(times)
        if scheme not in SCHEME_IDS:
            raise InputError(f"scheme = {scheme!r} must be one of auto, {', '.join(SCHEME_IDS)}")
        return scheme, {}

    # ---- running -----------------------------------------------------------------------
    def _call(self, inp: MlaInputs | SparseInputs, scheme: str, dry: bool,
              threads: Optional[int], dest: Optional[MlaOutputs] = None):
        p = self.schedule.problem
        fused = p.fused
        sparse = isinstance(inp, SparseInputs)
        b = inp.rows[0] if sparse else inp.block_table.shape[0]
        s_q = (inp.q_lora if fused else inp.q).shape[1]
        h = self.schedule.heads_per_device
        keep = []   # contiguous copies must outlive the call

        def c(t):
            if t is None:
                return None
            t = t.contiguous()
            keep.append(t)
            return t.data_ptr()

        out = lse = None
        if not dry:
            width = p.v_head_dim if fused else p.dv
            if dest is not None:   # the caller's (e.g. the verifier's NaN-poisoned) outputs
                _check_dest(dest, (b, s_q, h, width), TORCH_DTYPES[p.dtype], (b, h, s_q))
                out, lse = dest.out, dest.lse
            else:
                out = torch.empty(b, s_q, h, width, dtype=TORCH_DTYPES[p.dtype])
                lse = torch.empty(b, h, s_q, dtype=torch.float32)
        if sparse:
            from .sparse import sparse_args

            rope = _rope_fields(inp.weights if fused else None, inp.cache_seqlens, s_q,
                                True, dry, c)
            args = sparse_args(_Args, inp, c, out, lse, SCHEME_IDS[scheme], threads, p, rope)
        else:
            args = self._dense_args(inp, c, out, lse, scheme, threads, dry)
        res = _Result()
        err = ctypes.create_string_buffer(1024)
        rc = self.lib.mlagen_sc11_run(ctypes.byref(args), int(dry), ctypes.byref(res), err, 1024)
        try:
            if rc != 0:
                msg = f"{self.schedule.variant_name()} (scheme {scheme}): {err.value.decode()}"
                raise (InputError if rc == 2 else EmulatorError)(msg)
            n = res.n_events
            trace = np.frombuffer(ctypes.string_at(res.events, n * EVENT_DTYPE.itemsize),
                                  dtype=EVENT_DTYPE).copy() if n else np.zeros(0, EVENT_DTYPE)
        finally:
            self.lib.mlagen_sc11_free(ctypes.byref(res))
        stats = {"scheme": scheme, "lmem_high": res.lmem_high, "l2_high": res.l2_high,
                 "l2_static": res.l2_static, "lmem_capacity": res.lmem_capacity,
                 "l2_capacity": res.l2_capacity, "n_parts": res.n_parts,
                 "copied_bytes": res.copied_bytes}
        return out, lse, trace, stats

    def _dense_args(self, inp: MlaInputs, c, out, lse, scheme: str, threads, dry: bool):
        fused = self.schedule.problem.fused
        s_q = (inp.q_lora if fused else inp.q).shape[1]
        w = inp.weights if fused else None
        return _Args(batch=inp.block_table.shape[0], s_q=s_q, num_blocks=inp.k_cache.shape[0],
                     max_blocks=inp.block_table.shape[1], scheme=SCHEME_IDS[scheme],
                     causal=int(bool(inp.causal)), threads=int(threads or 0),
                     scale=float(inp.softmax_scale),
                     **_rope_fields(w, inp.cache_seqlens, s_q, inp.causal, dry, c),
                     q=None if fused else c(inp.q), q_lora=c(inp.q_lora) if fused else None,
                     w_uq=c(w.w_uq) if w else None, w_uk=c(w.w_uk) if w else None,
                     w_uv=c(w.w_uv) if w else None, k_cache=c(inp.k_cache),
                     block_table=c(inp.block_table), seqlens=c(inp.cache_seqlens),
                     out=_p(out), lse=_p(lse),
                     k_descale=c(inp.k_descale),
                     descale_n=inp.k_descale.numel() if inp.k_descale is not None else 0)

    def dry_run(self, inp: MlaInputs, scheme: Optional[str], validate: bool = True) -> np.ndarray:
        """The trace of a run (EVENT_DTYPE records) without doing the data work."""
        if validate:
            self.validate(inp)
        name = scheme if scheme in SCHEME_IDS else self._resolve(inp, scheme)[0]
        return self._call(inp, name, True, 1)[2]

    def __call__(self, inp: MlaInputs, scheme: Optional[str] = None,
                 threads: Optional[int] = None, out: Optional[MlaOutputs] = None
                 ) -> MlaOutputs:
        """Run on `inp`; with `out`, write into out.out / out.lse (contiguous CPU tensors
        of the right shape and dtype) instead of fresh ones."""
        self.validate(inp)
        name, times = self._resolve(inp, scheme)
        dest = out
        out, lse, trace, stats = self._call(inp, name, False, threads, dest)
        extra = {"trace": trace, **stats}
        if times:
            extra["scheme_times"] = times    # auto: simulated seconds of every scheme
        return MlaOutputs(out, lse, extra=extra)


LAYOUT_IDS = {"interleaved": 0, "half": 1}


def _rope_fields(weights, cache_seqlens, s_q: int, causal: bool, dry: bool, c) -> dict:
    """The ABI's rotary-table fields: the fused operator's table (rotary_table), or empty
    ones (attention only, or a dry run, which does no arithmetic)."""
    table = None if dry or weights is None else rotary_table(weights, cache_seqlens, s_q,
                                                              causal)
    return dict(rope_rows=table.rows if table else 0,
                rope_layout=LAYOUT_IDS[table.layout] if table else 0,
                rope_cos=c(table.cos) if table else None,
                rope_sin=c(table.sin) if table else None)


def rotary_table(weights, cache_seqlens: torch.Tensor, s_q: int = 1,
                 causal: bool = True) -> RotaryTable:
    """The fp32 table the kernel reads: the weights' own table, or one built from their rope
    config (plain RoPE at rope_theta when none) for the positions this call needs (rows
    rounded up to a power of two so that growing sequences reuse one table).  Without
    causal, a row at a negative position -k that sees keys reads row k (mlagen.rope)."""
    rope = weights_rope(weights)
    rope_dim = weights.w_uq.shape[-1] - weights.w_uk.shape[1]
    lens = cache_seqlens.tolist()
    longest = max(lens, default=0)
    deepest = 0 if causal else max((s_q - n for n in lens if 0 < n < s_q), default=0)
    if isinstance(rope, RotaryTable):
        if rope.half_dim != rope_dim // 2:
            raise InputError(f"the rotary table has {rope.half_dim} frequencies; rope_dim "
                             f"{rope_dim} needs {rope_dim // 2}")
        if longest > rope.rows:
            raise InputError(f"a sequence of {longest} tokens needs positions past the rotary "
                             f"table's {rope.rows} rows")
        if deepest >= rope.rows:
            raise InputError(f"a row at position -{deepest} (a sequence shorter than s_q, "
                             f"not causal) needs the rotary table's row {deepest}; it has "
                             f"{rope.rows} rows")
        return RotaryTable(rope.cos.float().cpu().contiguous(),
                           rope.sin.float().cpu().contiguous(), rope.layout)
    return _config_table(rope, rope_dim, max(1024, 1 << max(0, longest - 1).bit_length()))


@functools.lru_cache(maxsize=16)
def _config_table(rope: RopeConfig, rope_dim: int, rows: int) -> RotaryTable:
    return rope.table(rows, rope_dim)


def _check_dest(dest: MlaOutputs, out_shape: tuple, out_dtype, lse_shape: tuple) -> None:
    for name, t, shape, dtype in (("out", dest.out, out_shape, out_dtype),
                                  ("lse", dest.lse, lse_shape, torch.float32)):
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape or t.dtype != dtype \
                or t.device.type != "cpu" or not t.is_contiguous():
            got = (f"{tuple(t.shape)} {t.dtype} on {t.device}"
                   f"{'' if t.is_contiguous() else ', strided'}"
                   if isinstance(t, torch.Tensor) else type(t).__name__)
            raise InputError(f"out.{name} must be a contiguous CPU tensor {shape} of "
                             f"{dtype}; got {got}")


def runner(plan: Plan | Schedule, progress: Optional[bool] = None) -> Sc11Runner:
    """Build (cached) and load the plan's kernel; the result runs MlaInputs."""
    return Sc11Runner(plan, progress=progress)

