"""FlashMLA-compatible calls on the Hopper kernels (re-exported as mlagen.get_mla_metadata and
mlagen.flash_mla_with_kvcache).

    tile_scheduler_metadata, num_splits = get_mla_metadata(cache_seqlens, s_q * h_q // h_kv, h_kv)
    out, lse = flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, 512,
                                      tile_scheduler_metadata, num_splits, causal=True)

Conventions are FlashMLA's: q [b, s_q, h_q, 576], k_cache [num_blocks, page, 1, 576] (V is
its first 512 columns), out [b, s_q, h_q, 512] in q's dtype, lse fp32 [b, h_q, s_q] (natural
log); a query with no visible key gives out = 0 and lse = +inf; causal is bottom-right
aligned.  Beyond FlashMLA: page sizes 1..256, any h_q in 1..128, s_q 1..8, bf16 and fp16,
and an optional ``schedule=`` (a hopper Schedule) that replaces the default per shape.

Every input is checked before launch (dtypes, shapes, strides, devices); a bad one raises
mlagen.errors.InputError.  The checks run once per call signature: repeated calls with the
same shapes reuse a cached plan (about 20 us of host time per call instead of hundreds).

This module owns that per-signature cache and its miss path, which reads top to bottom:
the last plan's C++ path (fastcall.py) or the plan cached for the call's signature; on a
miss, the input checks, then ``_resolve``: the schedule (defaults.resolve: the caller's or
the per-shape default), its checked plan, its library (ops.library: built once, loaded
once); then the launch plan (ops.DecodePlan / ops.MetadataPlan), cached and run.

Block-table entries and lengths live on the GPU, so by default they are checked there, with
no host sync: a sequence with a page outside the cache (or a length beyond its table row, or
a negative one) gets NaN out and lse, and the device's error flag is set (never read out of
bounds).  ``device_error_flags(device)`` is that int32[1] tensor (read it when convenient);
``check_device_errors()`` syncs, raises InputError if a flag is set and clears it.  Strict
mode (``set_strict(True)`` or MLAGEN_HOPPER_STRICT=1) checks them on the host before each
launch instead, with one sync per call and a message naming the bad entry.
"""

from __future__ import annotations

import functools
from typing import Optional

import torch

from mlagen.envvars import switch
from mlagen.errors import InputError
from mlagen.schedule.records import Schedule
from mlagen.schedule.rules import plan_of

from mlagen import kvformat

from . import defaults, ops, scheduler, sparse
from .sparse import FlashMLASchedMeta

D, DV = 576, 512
_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16"}
_FP8_FORMATS = ("fp8_e4m3", "fp8_ds_mla")
_BYTE_DTYPES = (torch.float8_e4m3fn, torch.uint8)    # 8-bit caches' tensor dtypes
ops.STRICT = switch("MLAGEN_HOPPER_STRICT", False)
_DECODE_PLANS: dict = {}
_METADATA_PLANS: dict = {}
_PLAN_LIMIT = 4096         # plans kept per kind (a serving engine sees a handful of shapes)
_LAST: list = [None]       # the plan of the last cached call that has the C++ call path
_LAST_METADATA: list = [None]   # likewise for get_mla_metadata


def set_strict(on: bool = True) -> None:
    """Strict mode: block-table entries and lengths checked on the host before every launch
    (one sync per call, an InputError naming the bad entry)."""
    ops.STRICT = bool(on)


def device_error_flags(device=None) -> torch.Tensor:
    """The int32[1] flags that the kernels set on `device` (default: the current one) when
    a sequence had a bad page or length (1: page outside the cache or beyond the table row,
    2: negative length; 4: metadata planned for a cluster merge that this launch does not
    make, e.g. another batch's).  Reading it needs no sync of its own; it is never cleared by the
    kernels."""
    return ops.error_flags(torch.device("cuda", torch.cuda.current_device())
                           if device is None else torch.device(device))


def check_device_errors(device=None, clear: bool = True) -> None:
    """Sync with `device` and raise InputError if a kernel flagged a bad input since the
    last clear (the sequences concerned got NaN)."""
    flags = device_error_flags(device)
    v = int(flags.item())
    if v and clear:
        flags.zero_()
    if v:
        what = []
        if v & 1:
            what.append("a block_table entry outside [0, num_blocks) of k_cache, or a "
                        "cache_seqlens entry beyond its block_table row")
        if v & 2:
            what.append("a negative cache_seqlens entry")
        if v & 4:
            what.append("tile_scheduler_metadata planned for another launch (a cluster "
                        "merge this call does not make: get_mla_metadata for this batch, "
                        "with is_fp8_kvcache=True for an 8-bit cache)")
        if v & 8:
            what.append("a descale_k or descale_q entry that is not finite and > 0")
        raise InputError("the decode kernel found " + " and ".join(what) +
                         "; those sequences got NaN (set_strict(True) names the entry)")


@functools.lru_cache(maxsize=256)
def _resolve(rows_total: int, dtype: str, schedule: Optional[Schedule], batch: int = 0,
             gpu: str = "", page_size: int = 64, kv: str = "") -> tuple[str, int, int, int]:
    """The miss path of a call signature, in order: the schedule (the caller's, or the
    per-shape default: defaults.resolve), its checked plan, its library (built once,
    cached, loaded once); returns (library key, rows_per_tile, fixed splits, split cost),
    what the launch takes.  Memoized because checking a schedule costs about a
    millisecond, more than a decode step."""
    s = defaults.resolve(rows_total, dtype, schedule, batch, gpu, page_size, kv)
    plan = plan_of(s)
    key = ops.library(plan)
    m = plan.mapping
    return key, m.rows_per_tile, 0 if m.split_kv == "auto" else int(m.split_kv), m.split_cost


_GPU_NAMES: dict[int, str] = {}


def _per_shape(batch: int, device, schedule: Optional[Schedule]) -> tuple[int, str]:
    """(batch, GPU name) for the per-shape defaults (tuned tables are per GPU and batch,
    the name asked once per device); an explicit schedule needs neither."""
    if schedule is not None:
        return 0, ""
    idx = device.index if getattr(device, "index", None) is not None \
        else torch.cuda.current_device()
    if idx not in _GPU_NAMES:
        _GPU_NAMES[idx] = torch.cuda.get_device_name(idx)
    return batch, _GPU_NAMES[idx]


def _library_key(rows_total: int, dtype: str, schedule: Optional[Schedule], batch: int = 0,
                 device=None, page_size: int = 64, kv: str = "") -> str:
    # the page size picks the main loop: wgmma takes multiples of 64 only (defaults.py);
    # kv: an 8-bit cache's format ("": the cache is in the dtype)
    return _resolve(rows_total, dtype, schedule, *_per_shape(batch, device, schedule),
                    page_size, kv)[0]


def _metadata_plan(cache_seqlens: torch.Tensor, rows_total: int,
                   schedule: Optional[Schedule], kv: str = "") -> tuple[int, int, str, int]:
    # the schedule's own dtype and format: an fp16 (or FP8) schedule's metadata and decode
    # share one library
    dtype = schedule.problem.dtype if schedule is not None else "bf16"
    if schedule is not None:
        kv = "" if schedule.problem.kv in ("bf16", "fp16") else schedule.problem.kv
    key, rows, n, cost = _resolve(rows_total, dtype, schedule,
                                  *_per_shape(cache_seqlens.shape[0], cache_seqlens.device,
                                              schedule), 64, kv)
    b = cache_seqlens.shape[0]
    if n:
        return b * n, n, key, cost
    slots = ops.sm_count(cache_seqlens.device) * ops.get(key).ctas_per_sm()
    parts = scheduler.num_parts(slots, rows_total, rows)
    tiles = scheduler.row_tiles(rows_total, rows)
    if kv and rows == 64 and tiles % 2 == 0:
        # an 8-bit cache's row tiles in pairs, each pair a cluster (the crossover): as many
        # parts as the clusters that fit at once hold (a part more would run a second wave)
        pairs = tiles // 2
        parts = max(1, ops.get(key).cluster_parts(parts * pairs) // pairs)
    return parts, n, key, cost


def _outside_graph(fn):
    """fn, run outside torch.compile's graph when called under a compile: a build, a dlopen
    and a device query are side effects it must not trace.  torch.compiler.disable is made
    on the first compiled call, not at import: it imports torch._dynamo (about 2 s), which
    an eager caller (every verify worker) never needs."""
    disabled = []

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if not torch.compiler.is_compiling():
            return fn(*args, **kwargs)
        if not disabled:
            disabled.append(torch.compiler.disable(fn))
        return disabled[0](*args, **kwargs)

    return call


_library_key_compiled = _outside_graph(_library_key)
_metadata_plan_compiled = _outside_graph(_metadata_plan)


def _int_vector(name: str, t: torch.Tensor, n: Optional[int] = None) -> None:
    if not (isinstance(t, torch.Tensor)):
        raise InputError(f"{name} must be a torch.Tensor")
    if not (t.dtype == torch.int32):
        raise InputError(f"{name} must be int32, got {t.dtype}")
    if not (t.dim() == 1):
        raise InputError(f"{name} must be 1-D, got shape {tuple(t.shape)}")
    if n is not None:
        if not (t.shape[0] == n):
            raise InputError(f"{name} must have {n} entries, got {t.shape[0]}")
    if not (t.is_contiguous()):
        raise InputError(f"{name} must be contiguous")


def _on_cuda(tensors: dict[str, torch.Tensor]) -> torch.device:
    dev = None
    for name, t in tensors.items():
        if not (t.is_cuda):
            raise InputError(f"{name} must be on a CUDA device, got {t.device}")
        if dev is None:
            dev = t.device
        if not (t.device == dev):
            raise InputError(f"{name} is on {t.device} but the other inputs on {dev}")
    return dev


def get_mla_metadata(cache_seqlens: Optional[torch.Tensor] = None,
                     num_heads_per_head_k: Optional[int] = None,
                     num_heads_k: Optional[int] = None,
                     schedule: Optional[Schedule] = None, is_fp8_kvcache: bool = False,
                     kv_format: Optional[str] = None):
    """The split of a decode step, computed on the GPU: (tile_scheduler_metadata int32
    [num_sm_parts, 8], num_splits int32 [b + 1]).  Once per step, shared by all layers.

    With no cache_seqlens (FlashMLA 9241ae3's form, ``get_mla_metadata()``): (an empty
    FlashMLASchedMeta, None); the first flash_mla_with_kvcache call that takes it fills it
    (dense or sparse), later calls of the same shapes and lengths reuse it.

    An 8-bit cache (FlashMLA's ``is_fp8_kvcache=True``, or ``kv_format="fp8_e4m3"`` /
    ``"fp8_ds_mla"``; an explicit schedule says it itself) is read by another kernel than a
    bf16 cache of the same shape: its metadata must be made for it (metadata made for the
    bf16 kernel can plan a cluster merge the FP8 kernel does not make: NaN and flag 4)."""
    if cache_seqlens is None:
        return FlashMLASchedMeta(), None
    if num_heads_per_head_k is None or num_heads_k is None:
        raise InputError("get_mla_metadata(cache_seqlens, num_heads_per_head_k, num_heads_k), "
                         "or get_mla_metadata() for a FlashMLASchedMeta")
    kv = _metadata_kv(is_fp8_kvcache, kv_format)
    if not torch.compiler.is_compiling():
        last = _LAST_METADATA[0]
        try:
            hit = last is not None and last.tail == (num_heads_per_head_k, num_heads_k,
                                                      schedule, kv)
        except (RuntimeError, TypeError, ValueError):
            hit = False
        if hit:
            r = last.run_fast(cache_seqlens)      # None: not this plan's call
            if r is not None:
                return r
        try:
            key = (cache_seqlens.shape, cache_seqlens.stride(), cache_seqlens.dtype,
                   cache_seqlens.get_device(), num_heads_per_head_k, num_heads_k, schedule, kv)
            plan = _METADATA_PLANS.get(key)
        except (AttributeError, TypeError):
            plan = None
        if plan is not None:
            if plan.fast is not None:
                _LAST_METADATA[0] = plan
            return plan.run(cache_seqlens)
    _int_vector("cache_seqlens", cache_seqlens)
    if not (cache_seqlens.shape[0] >= 1):
        raise InputError("cache_seqlens must hold at least one sequence")
    if not (cache_seqlens.shape[0] <= 8192):
        raise InputError("at most 8192 sequences per call")
    if not (num_heads_k == 1):
        raise InputError(f"num_heads_k = {num_heads_k}: MLA has one latent KV head")
    if not (1 <= num_heads_per_head_k <= 1024):
        raise InputError(f"num_heads_per_head_k = s_q * h_q // h_kv = {num_heads_per_head_k} "
                         "must be in 1..1024 (h_q <= 128, s_q <= 8)")
    _on_cuda({"cache_seqlens": cache_seqlens})
    if torch.compiler.is_compiling():
        plan = _metadata_plan_compiled(cache_seqlens, num_heads_per_head_k, schedule, kv)
        return ops.get_mla_metadata_op(cache_seqlens, *plan)
    plan = ops.MetadataPlan(cache_seqlens,
                            *_metadata_plan(cache_seqlens, num_heads_per_head_k, schedule, kv))
    if len(_METADATA_PLANS) >= _PLAN_LIMIT:
        _METADATA_PLANS.clear()
    _METADATA_PLANS[(cache_seqlens.shape, cache_seqlens.stride(), cache_seqlens.dtype,
                     cache_seqlens.get_device(), num_heads_per_head_k, num_heads_k,
                     schedule, kv)] = plan
    plan.attach_fast(cache_seqlens, (num_heads_per_head_k, num_heads_k, schedule, kv))
    if plan.fast is not None:
        _LAST_METADATA[0] = plan
    return plan.run(cache_seqlens)


def _metadata_kv(is_fp8_kvcache, kv_format) -> str:
    """get_mla_metadata's cache format: "" (the dtype) or an 8-bit format's name."""
    if kv_format is not None:
        if kv_format not in _FP8_FORMATS + ("", "bf16", "fp16"):
            raise InputError(f"kv_format = {kv_format!r} must be one of "
                             f"{', '.join(_FP8_FORMATS)}, bf16, fp16 or None")
        if is_fp8_kvcache and kv_format not in _FP8_FORMATS:
            raise InputError(f"is_fp8_kvcache=True with kv_format = {kv_format!r}")
        return kv_format if kv_format in _FP8_FORMATS else ""
    return "fp8_e4m3" if is_fp8_kvcache else ""


def cache_format(q, k_cache) -> str:
    """The format of k_cache for this q: "" (in q's dtype) or an 8-bit format's name
    (float8_e4m3fn or uint8 bytes, by the last dimension: 576 fp8_e4m3, 656 fp8_ds_mla)."""
    if not (isinstance(q, torch.Tensor) and isinstance(k_cache, torch.Tensor)):
        raise InputError("q and k_cache must be torch.Tensors")
    if not (q.dtype in _DTYPES):
        raise InputError(f"q must be bfloat16 or float16, got {q.dtype}")
    if k_cache.dtype in _BYTE_DTYPES:
        kv = kvformat.detect(k_cache)
        if kv not in _FP8_FORMATS:
            raise InputError(f"k_cache is a {kv} cache; the hopper kernels read "
                             f"{', '.join(_FP8_FORMATS)} and caches in q's dtype")
        if kv == "fp8_ds_mla" and q.dtype != torch.bfloat16:
            raise InputError(f"an fp8_ds_mla cache holds bf16 RoPE values: q must be bfloat16, "
                             f"got {q.dtype}")
        return kv
    if not (k_cache.dtype == q.dtype):
        raise InputError(f"k_cache is {k_cache.dtype} but q is {q.dtype} (8-bit caches: "
                         "float8_e4m3fn or uint8)")
    return ""


def check_descales(kv: str, b: int, descale_k, descale_q) -> None:
    """descale_k: fp32 [1] or [b], contiguous, required by fp8_e4m3 and refused otherwise;
    descale_q (vLLM's): None or the same shape, 8-bit caches only.  Values live on the GPU:
    the kernel turns one not finite and > 0 into NaN and error flag 8 (no host sync)."""
    if kv:
        try:
            kvformat.check_descale(descale_k, kv, b)
        except InputError as e:      # the keyword's name in this API
            raise InputError(str(e).replace("k_descale", "descale_k")) from None
    elif descale_k is not None:
        raise InputError("descale_k is for fp8_e4m3 caches; this k_cache is in q's dtype")
    for name, t in (("descale_k", descale_k), ("descale_q", descale_q)):
        if t is None:
            continue
        if name == "descale_q":
            if not kv:
                raise InputError("descale_q is for 8-bit caches; this k_cache is in q's "
                                 "dtype")
            if not (isinstance(t, torch.Tensor) and t.dtype == torch.float32 and t.dim() == 1
                    and t.shape[0] in (1, b)):
                what = (f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor)
                        else type(t).__name__)
                raise InputError(f"descale_q must be fp32 [1] or [{b}], got {what}")
        if not t.is_contiguous():
            raise InputError(f"{name} must be contiguous")


def check_inputs(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                 num_splits, softmax_scale) -> str:
    """Raise InputError for anything the kernels cannot take (dtype, shape, device, stride);
    return the cache's format ("" or an 8-bit format's name, cache_format).  Shape and dtype
    checks come first, so they run on CPU tensors too."""
    kv = cache_format(q, k_cache)
    width = kvformat.get(kv).width() if kv else D
    if not (q.dim() == 4):
        raise InputError(f"q must be [b, s_q, h_q, {D}], got shape {tuple(q.shape)}")
    b, s_q, h_q, d = q.shape
    if not (d == D):
        raise InputError(f"q's last dimension must be {D} (kv_lora_rank 512 + rope 64), "
                         f"got {d}")
    if not (b >= 1):
        raise InputError("q must hold at least one sequence")
    if not (1 <= s_q <= 8):
        raise InputError(f"s_q = {s_q} must be in 1..8")
    if not (k_cache.dim() == 4):
        raise InputError(f"k_cache must be [num_blocks, page_size, h_kv, {D}], "
                         f"got shape {tuple(k_cache.shape)}")
    nb, page, h_kv, dk = k_cache.shape
    if not (dk == width):
        raise InputError(f"k_cache's last dimension must be {width}, got {dk}")
    if not (h_kv == 1):
        raise InputError(f"k_cache has h_kv = {h_kv}: MLA has one latent KV head")
    if not (1 <= h_q <= 128 and h_q % h_kv == 0):
        raise InputError(f"h_q = {h_q} must be in 1..128")
    if not (1 <= page <= 256):
        raise InputError(f"page size {page} must be in 1..256")
    if not (nb >= 1):
        raise InputError("k_cache has no blocks")
    if not (head_dim_v == DV):
        raise InputError(f"head_dim_v = {head_dim_v}: the kernels are built for {DV}")
    if not (q.stride(-1) == 1):
        raise InputError("q's last dimension must be contiguous (stride 1)")
    if not (k_cache.stride(-1) == 1):
        raise InputError("k_cache's last dimension must be contiguous (stride 1)")
    per16 = 16 if kv else 8      # elements in 16 bytes
    if not (k_cache.stride(1) % per16 == 0 and k_cache.stride(0) % per16 == 0):
        raise InputError(f"k_cache's block and token strides must be multiples of {per16} "
                         "elements (16 bytes)")
    if not (isinstance(block_table, torch.Tensor) and block_table.dtype == torch.int32):
        raise InputError("block_table must be an int32 tensor")
    if not (block_table.dim() == 2 and block_table.shape[0] == b):
        raise InputError(f"block_table must be [b = {b}, max_blocks], "
                         f"got shape {tuple(block_table.shape)}")
    if not (block_table.shape[1] >= 1):
        raise InputError("block_table has no columns")
    if not (block_table.stride(-1) == 1):
        raise InputError("block_table's last dimension must be contiguous")
    _int_vector("cache_seqlens", cache_seqlens, b)
    if not (isinstance(tile_scheduler_metadata, torch.Tensor)
            and tile_scheduler_metadata.dtype == torch.int32
            and tile_scheduler_metadata.dim() == 2
            and tile_scheduler_metadata.shape[1] == scheduler.META_INTS
            and tile_scheduler_metadata.shape[0] >= 1
            and tile_scheduler_metadata.is_contiguous()):
        raise InputError("tile_scheduler_metadata must be the contiguous int32 "
                         "[num_sm_parts, 8] tensor from get_mla_metadata")
    _int_vector("num_splits", num_splits, b + 1)
    if softmax_scale is not None:
        if not (float(softmax_scale) > 0 and float(softmax_scale) != float("inf")):
            raise InputError(f"softmax_scale = {softmax_scale} must be a positive finite number")
    return kv


def flash_mla_with_kvcache(q: torch.Tensor, k_cache: torch.Tensor,
                           block_table: Optional[torch.Tensor],
                           cache_seqlens: Optional[torch.Tensor], head_dim_v: int,
                           tile_scheduler_metadata, num_splits: Optional[torch.Tensor] = None,
                           softmax_scale: Optional[float] = None, causal: bool = False,
                           is_fp8_kvcache: bool = False,
                           indices: Optional[torch.Tensor] = None,
                           attn_sink: Optional[torch.Tensor] = None,
                           extra_k_cache: Optional[torch.Tensor] = None,
                           extra_indices_in_kvcache: Optional[torch.Tensor] = None,
                           topk_length: Optional[torch.Tensor] = None,
                           extra_topk_length: Optional[torch.Tensor] = None, *,
                           schedule: Optional[Schedule] = None,
                           out: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
                           descale_q: Optional[torch.Tensor] = None,
                           descale_k: Optional[torch.Tensor] = None
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Paged MLA decode: (out [b, s_q, h_q, 512] in q's dtype, lse fp32 [b, h_q, s_q]).

    FlashMLA 9241ae3's arguments too: tile_scheduler_metadata a FlashMLASchedMeta (from
    ``get_mla_metadata()``, num_splits None), and token-sparse decode: ``indices`` int32
    [b, s_q, topk] of cache slots (page * page_size + offset; negative: no key; repeats
    count as separate keys), ``topk_length`` int32 [b] (only the first entries count),
    ``attn_sink`` fp32 [h_q] (out scaled by exp(lse) / (exp(lse) + exp(sink))); block_table
    and cache_seqlens may then be None.  Sparse caches: bf16 [..., 576] or fp8_ds_mla
    (is_fp8_kvcache=True, [..., 656]), any page size 1..256 (sparse.py).  A second pool in
    the same softmax: ``extra_k_cache`` [blocks2, page2, 1, width] (the main cache's format,
    its own page size), ``extra_indices_in_kvcache`` int32 [b, s_q, extra_topk] (slots
    page * page2 + offset) and ``extra_topk_length`` int32 [b]; the sink applies once to
    the combined row.

    Beyond FlashMLA: ``out=(out, lse)`` writes into given contiguous tensors (eager only).

    8-bit caches (dequantized to q's dtype in the kernel; the metadata from
    ``get_mla_metadata(..., is_fp8_kvcache=True)``), recognised by dtype and last dimension:
    float8_e4m3fn or uint8 [num_blocks, page, 1, 576] is fp8_e4m3 (value = stored *
    descale_k, ``descale_k`` fp32 [1] or [b] required), [..., 656] is fp8_ds_mla (DeepSeek-V3.2's
    token: e4m3 latent, 4 fp32 tile scales, bf16 RoPE; q bf16; no descale_k).  Page sizes are
    multiples of 64.  ``descale_q`` (vLLM's, fp32 [1] or [b]) multiplies the scores.
    Descale values are read on the GPU: one not finite and > 0 gives NaN and error flag 8."""
    if indices is not None or type(tile_scheduler_metadata) is FlashMLASchedMeta \
            or attn_sink is not None or topk_length is not None or extra_k_cache is not None \
            or extra_indices_in_kvcache is not None or extra_topk_length is not None:
        return _flashmla_call(q, k_cache, block_table, cache_seqlens, head_dim_v,
                              tile_scheduler_metadata, num_splits, softmax_scale, causal,
                              is_fp8_kvcache, indices, attn_sink, extra_k_cache,
                              extra_indices_in_kvcache, topk_length, extra_topk_length,
                              schedule, out, descale_q, descale_k)
    if is_fp8_kvcache and getattr(k_cache, "dtype", None) not in _BYTE_DTYPES:
        raise InputError(f"is_fp8_kvcache=True but k_cache is {getattr(k_cache, 'dtype', None)}"
                         " (8-bit caches: float8_e4m3fn or uint8)")
    if descale_k is not None or descale_q is not None \
            or getattr(k_cache, "dtype", None) in _BYTE_DTYPES:
        return _fp8_call(q, k_cache, block_table, cache_seqlens, head_dim_v,
                         tile_scheduler_metadata, num_splits, softmax_scale, causal, schedule,
                         out, descale_q, descale_k)
    if out is None and not ops.STRICT and not torch.compiler.is_compiling():
        last = _LAST[0]
        try:
            hit = last is not None and last.tail == (head_dim_v, softmax_scale, causal,
                                                      schedule)
        except (RuntimeError, TypeError, ValueError):   # e.g. a tensor softmax_scale
            hit = False
        if hit:
            # the last plan's C++ path: it checks the tensors' signature itself (None: not
            # this plan's call)
            r = last.run_fast(q, k_cache, block_table, cache_seqlens, tile_scheduler_metadata,
                              num_splits)
            if r is not None:
                return r
        try:
            plan = _DECODE_PLANS.get(_signature(q, k_cache, block_table, cache_seqlens,
                                                head_dim_v, tile_scheduler_metadata,
                                                num_splits, softmax_scale, causal, schedule))
        except (AttributeError, TypeError):     # not tensors: the full checks say why
            plan = None
        if plan is not None:
            if plan.fast is not None:
                _LAST[0] = plan
            return plan.run(q, k_cache, block_table, cache_seqlens, tile_scheduler_metadata,
                            num_splits)
    kv = check_inputs(q, k_cache, block_table, cache_seqlens, head_dim_v,
                      tile_scheduler_metadata, num_splits, softmax_scale)
    if kv:
        # an 8-bit cache with no descale: fp8_ds_mla's calls, or fp8_e4m3's refusal
        return _fp8_call(q, k_cache, block_table, cache_seqlens, head_dim_v,
                         tile_scheduler_metadata, num_splits, softmax_scale, causal, schedule,
                         out, descale_q, descale_k, kv)
    if out is not None:
        _check_out(q, out)
    _on_cuda({"q": q, "k_cache": k_cache, "block_table": block_table,
              "cache_seqlens": cache_seqlens, "tile_scheduler_metadata": tile_scheduler_metadata,
              "num_splits": num_splits})
    q0 = q
    if any(st % 8 for st in q.stride()[:3]):
        q = q.contiguous()           # the kernel loads 16-byte pieces of q's rows
    scale = float(softmax_scale) if softmax_scale is not None else D ** -0.5
    b, s_q, h_q, _ = q.shape
    if torch.compiler.is_compiling():
        if out is not None:
            raise InputError("out= is not supported under torch.compile")
        key = _library_key_compiled(s_q * h_q, _DTYPES[q.dtype], schedule, b, q.device,
                                    k_cache.shape[1])
        return ops.mla_decode_op(q, k_cache, block_table, cache_seqlens,
                                 tile_scheduler_metadata, num_splits, scale, bool(causal), key)
    key = _library_key(s_q * h_q, _DTYPES[q.dtype], schedule, b, q.device, k_cache.shape[1])
    if out is not None or ops.STRICT:
        return ops.decode_into(q, k_cache, block_table, cache_seqlens, tile_scheduler_metadata,
                               num_splits, scale, bool(causal), key,
                               *(out if out is not None else (None, None)))
    plan = ops.DecodePlan(q, k_cache, block_table, tile_scheduler_metadata.shape[0], scale,
                          bool(causal), key)
    if q is q0 and (softmax_scale is None or isinstance(softmax_scale, (int, float))):
        if len(_DECODE_PLANS) >= _PLAN_LIMIT:
            _DECODE_PLANS.clear()
        _DECODE_PLANS[_signature(q, k_cache, block_table, cache_seqlens, head_dim_v,
                                 tile_scheduler_metadata, num_splits, softmax_scale, causal,
                                 schedule)] = plan
        plan.attach_fast([q, k_cache, block_table, cache_seqlens, tile_scheduler_metadata,
                          num_splits], (head_dim_v, softmax_scale, causal, schedule))
        if plan.fast is not None:
            _LAST[0] = plan
    return plan.run(q, k_cache, block_table, cache_seqlens, tile_scheduler_metadata,
                    num_splits)


def _flashmla_call(q, k_cache, block_table, cache_seqlens, head_dim_v, sched, num_splits,
                   softmax_scale, causal, is_fp8_kvcache, indices, attn_sink, extra_k_cache,
                   extra_indices, topk_length, extra_topk_length, schedule, out, descale_q,
                   descale_k):
    """FlashMLA 9241ae3's calls: sparse (indices) or dense with a FlashMLASchedMeta."""
    meta = type(sched) is FlashMLASchedMeta
    if meta and num_splits is not None:
        raise InputError("num_splits must be None with a FlashMLASchedMeta (FlashMLA's rule)")
    if not meta and not (sched is None and indices is not None) \
            and not isinstance(sched, torch.Tensor):
        raise InputError("tile_scheduler_metadata must be a FlashMLASchedMeta (from "
                         "get_mla_metadata()) or the tensor of get_mla_metadata(cache_seqlens, "
                         "...)")
    if indices is None:
        for name, t in (("attn_sink", attn_sink), ("topk_length", topk_length),
                        ("extra_k_cache", extra_k_cache),
                        ("extra_indices_in_kvcache", extra_indices),
                        ("extra_topk_length", extra_topk_length)):
            if t is not None:
                raise InputError(f"{name} is for sparse attention: give indices too")
        if not meta:
            raise InputError("dense decode with a metadata tensor takes num_splits")
        if block_table is None or cache_seqlens is None:
            raise InputError("dense decode needs block_table and cache_seqlens")
        if is_fp8_kvcache and getattr(k_cache, "dtype", None) not in _BYTE_DTYPES:
            raise InputError(f"is_fp8_kvcache=True but k_cache is "
                             f"{getattr(k_cache, 'dtype', None)}")
        kv = cache_format(q, k_cache) if isinstance(q, torch.Tensor) else ""
        if not (isinstance(q, torch.Tensor) and q.dim() == 4):
            raise InputError("q must be [b, s_q, h_q, 576]")
        config = ("dense", tuple(q.shape[:3]), tuple(k_cache.shape[1:3]), bool(causal), kv,
                  schedule)
        if not sched.have_initialized:
            md, ns = get_mla_metadata(cache_seqlens, q.shape[1] * q.shape[2], 1,
                                      schedule=schedule, kv_format=kv or None)
            sched.have_initialized, sched.config = True, config
            sched.tile_scheduler_metadata, sched.num_splits = md, ns
        elif sched.config != config:
            raise InputError(f"tile_scheduler_metadata was filled for {sched.config}, this call "
                             f"is {config}: one FlashMLASchedMeta per shape")
        return flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v,
                                      sched.tile_scheduler_metadata, sched.num_splits,
                                      softmax_scale, causal, schedule=schedule, out=out,
                                      descale_q=descale_q, descale_k=descale_k)
    for name, t in (("out", out), ("descale_q", descale_q), ("descale_k", descale_k)):
        if t is not None:
            raise InputError(f"{name}= is not taken by sparse decode")
    if not meta and sched is not None:
        raise InputError("sparse decode takes a FlashMLASchedMeta (get_mla_metadata()) as "
                         "tile_scheduler_metadata")
    return sparse.sparse_decode(q, k_cache, indices, topk_length, attn_sink,
                                sched if meta else None, head_dim_v, softmax_scale, causal,
                                is_fp8_kvcache, schedule, extra_k_cache, extra_indices,
                                extra_topk_length)


_FP8_PLANS: dict = {}


def _fp8_call(q, k_cache, block_table, cache_seqlens, head_dim_v, md, num_splits,
              softmax_scale, causal, schedule, out, descale_q, descale_k, kv=None):
    """A call with an 8-bit cache or a descale: the checks (once per signature, the
    descales' shapes with it), then the Python launch path (no C++ fast path: it carries
    no descale pointers)."""
    try:
        sig = (_signature(q, k_cache, block_table, cache_seqlens, head_dim_v, md, num_splits,
                          softmax_scale, causal, schedule),
               _tensor_sig(descale_k), _tensor_sig(descale_q))
        plan = _FP8_PLANS.get(sig) if out is None and not ops.STRICT \
            and not torch.compiler.is_compiling() else None
    except (AttributeError, TypeError):     # not tensors: the full checks say why
        sig, plan = None, None
    if plan is None:
        if kv is None:
            kv = check_inputs(q, k_cache, block_table, cache_seqlens, head_dim_v, md,
                              num_splits, softmax_scale)
        b = q.shape[0]
        check_descales(kv, b, descale_k, descale_q)
        if out is not None:
            _check_out(q, out)
        named = {"q": q, "k_cache": k_cache, "block_table": block_table,
                 "cache_seqlens": cache_seqlens, "tile_scheduler_metadata": md,
                 "num_splits": num_splits}
        named.update({n: t for n, t in (("descale_k", descale_k), ("descale_q", descale_q))
                      if t is not None})
        _on_cuda(named)
        if any(st % 8 for st in q.stride()[:3]):
            q = q.contiguous()
            sig = None                # a copied q: no cached plan for its signature
        scale = float(softmax_scale) if softmax_scale is not None else D ** -0.5
        _, s_q, h_q, _ = q.shape
        if torch.compiler.is_compiling():
            if out is not None:
                raise InputError("out= is not supported under torch.compile")
            key = _library_key_compiled(s_q * h_q, _DTYPES[q.dtype], schedule, b, q.device,
                                        k_cache.shape[1], kv)
            return ops.mla_decode_op(q, k_cache, block_table, cache_seqlens, md, num_splits,
                                     scale, bool(causal), key, descale_k, descale_q)
        key = _library_key(s_q * h_q, _DTYPES[q.dtype], schedule, b, q.device,
                           k_cache.shape[1], kv)
        if out is not None or ops.STRICT:
            return ops.decode_into(q, k_cache, block_table, cache_seqlens, md, num_splits,
                                   scale, bool(causal), key,
                                   *(out if out is not None else (None, None)),
                                   k_descale=descale_k, q_descale=descale_q)
        plan = ops.DecodePlan(q, k_cache, block_table, md.shape[0], scale, bool(causal), key,
                              descale_k, descale_q)
        if sig is not None and (softmax_scale is None
                                or isinstance(softmax_scale, (int, float))):
            if len(_FP8_PLANS) >= _PLAN_LIMIT:
                _FP8_PLANS.clear()
            _FP8_PLANS[sig] = plan
    return plan.run(q, k_cache, block_table, cache_seqlens, md, num_splits,
                    k_descale=descale_k, q_descale=descale_q)


def _tensor_sig(t) -> tuple:
    if t is None:
        return ()
    return (t.shape, t.stride(), t.dtype, t.get_device())


def _signature(q, k_cache, block_table, cache_seqlens, head_dim_v, md, num_splits,
               softmax_scale, causal, schedule) -> tuple:
    """Everything the input checks and the plan depend on, except data and pointers."""
    return (q.shape, q.stride(), q.dtype, q.get_device(),
            k_cache.shape, k_cache.stride(), k_cache.dtype, k_cache.get_device(),
            block_table.shape, block_table.stride(), block_table.dtype,
            block_table.get_device(),
            cache_seqlens.shape, cache_seqlens.stride(), cache_seqlens.dtype,
            cache_seqlens.get_device(),
            md.shape, md.stride(), md.dtype, md.get_device(),
            num_splits.shape, num_splits.stride(), num_splits.dtype, num_splits.get_device(),
            head_dim_v, softmax_scale, causal, schedule)


def _check_out(q: torch.Tensor, out) -> None:
    b, s_q, h_q, _ = q.shape
    want = (((b, s_q, h_q, DV), q.dtype), ((b, h_q, s_q), torch.float32))
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        raise InputError("out= must be a pair (out, lse)")
    for name, t, (shape, dtype) in zip(("out", "lse"), out, want):
        if not (isinstance(t, torch.Tensor) and tuple(t.shape) == shape and t.dtype == dtype
                and t.device == q.device and t.is_contiguous()):
            raise InputError(f"out= {name} must be a contiguous {dtype} tensor of shape "
                             f"{list(shape)} on {q.device}")
    if out[0].data_ptr() % 16:   # the kernels write out's rows with 16-byte bulk copies
        raise InputError("out= out must start on a 16-byte boundary")
