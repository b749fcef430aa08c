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

E4M3_MAX = 448.0
DS_TILE = 128                 # latent values per fp8_ds_mla scale
DS_SCALE_FLOOR = 1e-4         # amax / 448 is clamped below at this before rounding up
FP8 = torch.float8_e4m3fn


@dataclass(frozen=True)
class KvFormat:
    name: str
    quantized: bool           # stored in 8 bits, not in the storage dtype
    needs_descale: bool       # the call passes k_descale
    doc: str

    def width(self, rank: int = 512, rope: int = 64) -> int:
        """Elements of the cache tensor's last dimension (bytes, for an 8-bit format)."""
        if self.name == "fp8_ds_mla":
            return rank + 4 * (rank // DS_TILE) + 2 * rope
        return rank + rope

    def token_bytes(self, rank: int = 512, rope: int = 64) -> int:
        """Bytes one token occupies (what a kernel streams per key)."""
        return self.width(rank, rope) * (1 if self.quantized else 2)


_FORMATS = {
    "bf16": KvFormat("bf16", False, False, "the token in bf16"),
    "fp16": KvFormat("fp16", False, False, "the token in fp16"),
    "fp8_e4m3": KvFormat("fp8_e4m3", True, True,
                         "e4m3 values times one fp32 descale per cache or sequence"),
    "fp8_ds_mla": KvFormat("fp8_ds_mla", True, False,
                           "e4m3 latent with a power-of-two fp32 scale per 128 values, "
                           "bf16 rope (656 bytes for 512 + 64)"),
}
FORMATS = tuple(_FORMATS)
PLAIN_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def get(name: str) -> KvFormat:
    try:
        return _FORMATS[name]
    except KeyError:
        raise InputError(f"kv_format {name!r} is not one of {', '.join(FORMATS)}") from None


def detect(k_cache: torch.Tensor, rank: int = 512, rope: int = 64) -> str:
    """The format of a cache tensor, from its dtype and last dimension."""
    w = k_cache.shape[-1] if k_cache.dim() else -1
    if k_cache.dtype in (torch.bfloat16, torch.float16):
        name = "bf16" if k_cache.dtype == torch.bfloat16 else "fp16"
        if w == rank + rope:
            return name
    elif k_cache.dtype in (FP8, torch.uint8):
        for name in ("fp8_e4m3", "fp8_ds_mla"):
            if w == _FORMATS[name].width(rank, rope):
                return name
    raise InputError(
        f"k_cache {k_cache.dtype} [..., {w}] is no KV format for kv_lora_rank {rank} + "
        f"rope {rope}: bf16/fp16 [..., {rank + rope}], float8_e4m3fn [..., {rank + rope}] "
        f"(fp8_e4m3) or [..., {_FORMATS['fp8_ds_mla'].width(rank, rope)}] (fp8_ds_mla)")


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

def ds_scales(latent: torch.Tensor) -> torch.Tensor:
    """fp8_ds_mla's scale of each 128-value tile of latent [..., rank]: float32
    [..., rank / 128], amax / 448 clamped at 1e-4 and rounded up to a power of two (the
    amax taken in the input's dtype)."""
    tiles = latent.unflatten(-1, (-1, DS_TILE))
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
    if rank % DS_TILE:
        raise InputError(f"fp8_ds_mla needs kv_lora_rank a multiple of {DS_TILE}, got {rank}")
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
    raw = cache.view(torch.uint8)
    tiles = rank // DS_TILE
    latent = raw[..., :rank].view(FP8).to(dtype)
    scales = raw[..., rank:rank + 4 * tiles].contiguous().view(torch.float32).to(dtype)
    rope = raw[..., rank + 4 * tiles:].contiguous().view(torch.bfloat16).to(dtype)
    latent = (latent.unflatten(-1, (tiles, DS_TILE)) * scales[..., None]).flatten(-2)
    return torch.cat((latent, rope), dim=-1)


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
    stored = quantize(kv.to(k_cache.device)[keep], name, descale, rank)
    target = k_cache.view(torch.uint8) if fmt.quantized else k_cache
    target[slots // page, slots % page, 0] = stored.view(target.dtype)
