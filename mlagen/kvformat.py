"""KV-cache formats: how one token of the latent cache (c_kv | k_pe) is stored.

A format is data: its name, the width of the cache tensor's last dimension for a problem's
(kv_lora_rank, rope_dim), and how a stored token maps back to its values.  Every kernel,
the reference and the writer go through this module, so a format is defined once.

    "bf16", "fp16"   the token in the storage dtype, rank + rope values
    "fp8_e4m3"       rank + rope e4m3 values (torch.float8_e4m3fn); value = stored * k_descale,
                     k_descale fp32 [1] (one for the cache) or [b] (one per sequence), as
                     vLLM's dense FP8 cache and its FlashMLA fork read it
    "fp8_ds_mla"     DeepSeek-V3.2's token of rank + 4 rank / 128 + 2 rope bytes (656 for
                     512 + 64): rank e4m3 values, then one fp32 scale per 128 of them (a power
                     of two), then rope bf16 values, not quantized.  value = e4m3 * scale.
                     The tensor is float8_e4m3fn (or uint8) [blocks, page, 1, 656]
    "fp8_ue8m0_paged"  a page-major layout (DeepSeek-V4's cache, FlashMLA's MODEL1): per page,
                     first every token's data row of rank e4m3 values and rope bf16 values
                     (576 bytes for 448 + 64), then every token's rank / 64 UE8M0 scales (one
                     per 64 values, 2^(byte - 127)) and one pad byte.  The tensor is viewed as
                     [blocks, page, 1, rank + 2 rope + rank / 64 + 1] (584), its block stride
                     the page's bytes rounded up to a multiple of 576; a "token" of that view
                     is no token, only the page is.

Quantization (``quantize``, ``write``) rounds as the formats' producers do:
fp8_ds_mla's scale of a 128-value tile is amax(|x|) / 448 in float32, clamped below at 1e-4
and rounded up to a power of two, and the stored value is e4m3(x / scale) (FlashMLA's
tests/quant.py); fp8_e4m3 stores e4m3(x / k_descale) saturated to +-448 (a finite value
never becomes NaN; NaN stays NaN).

Dequantization is exact: an e4m3 value times a power of two is a bf16 value, and the
reference multiplies by k_descale in its own precision.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from .errors import InputError
from .formats import DS_TILE, FORMATS, PAGED_ALIGN, PAGED_TILE, KvFormat, get

__all__ = ["KvFormat", "FORMATS", "get", "detect", "check_descale", "quantize", "dequantize",
           "write", "paged_rows", "ds_scales", "E4M3_MAX", "DS_TILE", "PAGED_TILE"]

E4M3_MAX = 448.0
DS_SCALE_FLOOR = 1e-4         # amax / 448 is clamped below at this before rounding up
FP8 = torch.float8_e4m3fn


PLAIN_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def detect(k_cache: torch.Tensor, rank: int = 512, rope: int = 64) -> str:
    """The format of a cache tensor, from its dtype and last dimension."""
    w = k_cache.shape[-1] if k_cache.dim() else -1
    if k_cache.dtype in (torch.bfloat16, torch.float16):
        name = "bf16" if k_cache.dtype == torch.bfloat16 else "fp16"
        if w == rank + rope:
            return name
    elif k_cache.dtype in (FP8, torch.uint8):
        for name in ("fp8_e4m3", "fp8_ds_mla", "fp8_ue8m0_paged"):
            if w == get(name).width(rank, rope):
                return name
    raise InputError(
        f"k_cache {k_cache.dtype} [..., {w}] is no KV format for kv_lora_rank {rank} + "
        f"rope {rope}: bf16/fp16 [..., {rank + rope}], float8_e4m3fn [..., {rank + rope}] "
        f"(fp8_e4m3), [..., {get('fp8_ds_mla').width(rank, rope)}] (fp8_ds_mla) or "
        f"[..., {get('fp8_ue8m0_paged').width(rank, rope)}] (fp8_ue8m0_paged)")


def check_descale(descale: Optional[torch.Tensor], name: str, batch: int,
                  device: Optional[torch.device] = None) -> Optional[torch.Tensor]:
    """k_descale as a format takes it: fp32 [1] or [batch], finite and > 0 where checked
    on the host (a CPU tensor); None for formats without one."""
    fmt = get(name)
    if not fmt.needs_descale:
        if descale is not None:
            raise InputError(f"k_descale is for fp8_e4m3 caches; a {name} cache takes none")
        return None
    if descale is None:
        raise InputError(f"a {name} cache needs k_descale (fp32 [1] or [{batch}])")
    if not isinstance(descale, torch.Tensor) or descale.dtype != torch.float32 \
            or descale.dim() != 1 or descale.shape[0] not in (1, batch):
        what = (f"{descale.dtype} {tuple(descale.shape)}" if isinstance(descale, torch.Tensor)
                else type(descale).__name__)
        raise InputError(f"k_descale must be fp32 [1] or [{batch}], got {what}")
    if device is not None and descale.device != device:
        raise InputError(f"k_descale is on {descale.device}, the cache on {device}")
    if descale.device.type == "cpu":
        if not bool(torch.isfinite(descale).all()) or not bool((descale > 0).all()):
            raise InputError("k_descale must be finite and > 0")
    return descale


# ---- quantization ------------------------------------------------------------------

def ds_scales(latent: torch.Tensor, tile: int = DS_TILE) -> torch.Tensor:
    """The scale of each tile of latent [..., rank]: float32 [..., rank / tile], amax / 448
    clamped at 1e-4 and rounded up to a power of two (the amax taken in the input's
    dtype).  fp8_ds_mla's tiles are 128 values, fp8_ue8m0_paged's 64."""
    tiles = latent.unflatten(-1, (-1, tile))
    s = tiles.abs().amax(dim=-1).float() / E4M3_MAX
    return torch.exp2(torch.ceil(torch.log2(torch.clamp_min(s, DS_SCALE_FLOOR))))


def _e4m3(x: torch.Tensor) -> torch.Tensor:
    """float32 -> e4m3, saturating finite values at +-448 (NaN stays NaN)."""
    return torch.where(torch.isnan(x), x, x.clamp(-E4M3_MAX, E4M3_MAX)).to(FP8)


def quantize(x: torch.Tensor, name: str, descale: Optional[torch.Tensor] = None,
             rank: Optional[int] = None) -> torch.Tensor:
    """Tokens x [..., rank + rope] (any float dtype) in format `name`: [..., width] in the
    format's tensor dtype.  rank defaults to 512 (rope the rest).  fp8_e4m3 divides by
    descale (a scalar tensor, or [n] broadcast over x's first dimension)."""
    fmt = get(name)
    rank = 512 if rank is None else rank
    if x.shape[-1] <= rank:
        raise InputError(f"tokens of {x.shape[-1]} values have no rope part after rank {rank}")
    if not fmt.quantized:
        return x.to(PLAIN_DTYPES[name])
    if name == "fp8_e4m3":
        if descale is None:
            raise InputError("fp8_e4m3 quantization needs a descale")
        d = descale.to(x.device, torch.float32)
        if d.numel() > 1:
            d = d.reshape(-1, *([1] * (x.dim() - 1)))
        return _e4m3(x.float() / d)
    if rank % fmt.tile():
        raise InputError(f"{name} needs kv_lora_rank a multiple of {fmt.tile()}, got {rank}")
    if fmt.paged:
        return _quantize_paged(x, rank)
    latent = x[..., :rank]
    scales = ds_scales(latent)                                         # [..., rank / 128]
    q = (latent.float().unflatten(-1, (-1, DS_TILE)) / scales[..., None]).flatten(-2)
    out = torch.empty(*x.shape[:-1], fmt.width(rank, x.shape[-1] - rank), dtype=torch.uint8,
                      device=x.device)
    out[..., :rank] = q.to(FP8).view(torch.uint8)
    out[..., rank:rank + 4 * (rank // DS_TILE)] = scales.contiguous().view(torch.uint8)
    out[..., rank + 4 * (rank // DS_TILE):] = \
        x[..., rank:].to(torch.bfloat16).contiguous().view(torch.uint8)
    return out.view(FP8)


def dequantize(cache: torch.Tensor, name: str, descale: Optional[torch.Tensor] = None,
               rank: int = 512, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Stored tokens [..., width] -> values [..., rank + rope] in dtype.  descale (fp8_e4m3):
    a scalar tensor, or [n] broadcast over the first dimension."""
    fmt = get(name)
    if not fmt.quantized:
        return cache.to(dtype)
    if name == "fp8_e4m3":
        v = cache.view(FP8).to(dtype)
        if descale is not None:
            d = descale.to(cache.device, dtype)
            v = v * (d.reshape(-1, *([1] * (v.dim() - 1))) if d.numel() > 1 else d)
        return v
    if fmt.paged:
        return _dequantize_paged(cache, rank, dtype)
    raw = cache.view(torch.uint8)
    tiles = rank // DS_TILE
    latent = raw[..., :rank].view(FP8).to(dtype)
    scales = raw[..., rank:rank + 4 * tiles].contiguous().view(torch.float32).to(dtype)
    rope = raw[..., rank + 4 * tiles:].contiguous().view(torch.bfloat16).to(dtype)
    latent = (latent.unflatten(-1, (tiles, DS_TILE)) * scales[..., None]).flatten(-2)
    return torch.cat((latent, rope), dim=-1)


# ---- the page-major layout (fp8_ue8m0_paged) ---------------------------------------

def _paged_sizes(rank: int, rope: int) -> tuple[int, int]:
    """Bytes of a token's data row (e4m3 latent, bf16 rope) and of its scale row."""
    return rank + 2 * rope, rank // PAGED_TILE + 1


def paged_rows(cache: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Views of a page-major cache [blocks, page, 1, width] (any block stride) as its data
    rows uint8 [blocks, page, rank + 2 rope] and scale rows uint8 [blocks, page, 8]."""
    blocks, page, _, width = cache.shape
    rope = (width - rank // PAGED_TILE - 1 - rank) // 2
    data, sc = _paged_sizes(rank, rope)
    raw = cache.view(torch.uint8)
    if raw.stride(3) != 1 or raw.stride(1) != width:
        raise InputError("a fp8_ue8m0_paged cache must keep each page's bytes contiguous")
    pages = raw.as_strided((blocks, page * width), (raw.stride(0), 1), raw.storage_offset())
    return (pages[:, :page * data].unflatten(1, (page, data)),
            pages[:, page * data:].unflatten(1, (page, sc)))


def _quantize_paged(x: torch.Tensor, rank: int) -> torch.Tensor:
    if x.dim() != 4 or x.shape[2] != 1:
        raise InputError(f"fp8_ue8m0_paged quantizes whole pages [blocks, page, 1, values], "
                         f"got {tuple(x.shape)}")
    blocks, page, _, d = x.shape
    rope = d - rank
    width = get("fp8_ue8m0_paged").width(rank, rope)
    stride = -(-page * width // PAGED_ALIGN) * PAGED_ALIGN
    buf = torch.zeros(blocks, stride, dtype=torch.uint8, device=x.device)
    cache = buf[:, :page * width].view(blocks, page, 1, width)
    data, scale_rows = paged_rows(cache, rank)
    _store_paged(data, scale_rows, x[:, :, 0], rank)
    return cache.view(FP8)


def _store_paged(data: torch.Tensor, scale_rows: torch.Tensor, x: torch.Tensor,
                 rank: int) -> None:
    """Tokens x [..., rank + rope] into data rows [..., rank + 2 rope] and scale rows
    [..., rank / 64 + 1] (uint8 views, written in place)."""
    scales = ds_scales(x[..., :rank], PAGED_TILE)                       # powers of two
    q = (x[..., :rank].float().unflatten(-1, (-1, PAGED_TILE)) / scales[..., None]).flatten(-2)
    data[..., :rank] = q.to(FP8).view(torch.uint8)
    data[..., rank:] = x[..., rank:].to(torch.bfloat16).contiguous().view(torch.uint8)
    # UE8M0: the biased exponent of a power of two (frexp's mantissa is 0.5)
    _, e = torch.frexp(scales)
    scale_rows[..., :rank // PAGED_TILE] = (e - 1 + 127).clamp(0, 254).to(torch.uint8)
    scale_rows[..., rank // PAGED_TILE:] = 0


def _dequantize_paged(cache: torch.Tensor, rank: int, dtype: torch.dtype) -> torch.Tensor:
    """Whole pages [..., page, 1, width] (each page's bytes in order, as a gather of pages
    or the cache itself) -> values [..., page, 1, rank + rope]."""
    *lead, page, one, width = cache.shape
    rope = (width - rank // PAGED_TILE - 1 - rank) // 2
    data_b, sc_b = _paged_sizes(rank, rope)
    if cache.dim() == 4 and cache.stride(0) != page * width:
        data, scale_rows = paged_rows(cache, rank)                      # the padded cache
    else:
        raw = cache.reshape(*lead, page * width).view(torch.uint8) if cache.dtype != torch.uint8 \
            else cache.reshape(*lead, page * width)
        data = raw[..., :page * data_b].unflatten(-1, (page, data_b))
        scale_rows = raw[..., page * data_b:].unflatten(-1, (page, sc_b))
    latent = data[..., :rank].contiguous().view(FP8).to(dtype)
    rope_v = data[..., rank:].contiguous().view(torch.bfloat16).to(dtype)
    e = scale_rows[..., :rank // PAGED_TILE].to(torch.int32)
    scales = torch.where(e == 255, torch.nan, torch.exp2((e - 127).to(dtype)))
    latent = (latent.unflatten(-1, (-1, PAGED_TILE)) * scales[..., None]).flatten(-2)
    return torch.cat((latent, rope_v), dim=-1).unsqueeze(-2)


# ---- the writer --------------------------------------------------------------------

def write(k_cache: torch.Tensor, slot_mapping: torch.Tensor, kv: torch.Tensor, name: str,
          descale: Optional[torch.Tensor] = None, rank: int = 512) -> None:
    """Store new tokens into a paged cache in place (vLLM's concat_and_cache_mla):
    kv [n, rank + rope] (c_kv | k_pe), slot_mapping int [n] = page * page_size + offset
    (-1: skip that token), k_cache [blocks, page, 1, width] in format `name` (descale for
    fp8_e4m3: a scalar tensor).  Works on any device; the quantized bytes are the same."""
    fmt = get(name)
    if k_cache.dim() != 4 or k_cache.shape[2] != 1:
        raise InputError(f"k_cache must be [blocks, page, 1, width], got {tuple(k_cache.shape)}")
    if kv.dim() != 2 or slot_mapping.dim() != 1 or slot_mapping.shape[0] != kv.shape[0]:
        raise InputError(f"kv must be [n, values] and slot_mapping [n], got kv "
                         f"{tuple(kv.shape)}, slot_mapping {tuple(slot_mapping.shape)}")
    width = fmt.width(rank, kv.shape[1] - rank)
    if k_cache.shape[3] != width:
        raise InputError(f"a {name} cache for {kv.shape[1]} values a token is [..., {width}], "
                         f"got [..., {k_cache.shape[3]}]")
    if fmt.needs_descale and (descale is None or descale.numel() != 1):
        raise InputError(f"writing a {name} cache needs one descale (a scalar tensor)")
    page = k_cache.shape[1]
    slots = slot_mapping.to(k_cache.device).long()
    keep = slots >= 0
    if bool((slots >= k_cache.shape[0] * page).any()):
        raise InputError(f"slot_mapping has a slot past the cache's {k_cache.shape[0] * page}")
    slots = slots[keep]
    if fmt.paged:
        data, scale_rows = paged_rows(k_cache, rank)
        new = kv.to(k_cache.device)[keep]
        d_rows = torch.empty(new.shape[0], data.shape[-1], dtype=torch.uint8, device=new.device)
        s_rows = torch.empty(new.shape[0], scale_rows.shape[-1], dtype=torch.uint8,
                             device=new.device)
        _store_paged(d_rows, s_rows, new, rank)
        data[slots // page, slots % page] = d_rows
        scale_rows[slots // page, slots % page] = s_rows
        return
    stored = quantize(kv.to(k_cache.device)[keep], name, descale, rank)
    target = k_cache.view(torch.uint8) if fmt.quantized else k_cache
    target[slots // page, slots % page, 0] = stored.view(target.dtype)
