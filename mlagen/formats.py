"""The KV-cache formats as data: each format's name, what it stores and the width of a
cache tensor's last dimension for a problem's (kv_lora_rank, rope_dim).  No torch here: the
schedule checker reads these; the codecs (quantize, dequantize, the writer) are
mlagen/kvformat.py's.  docs/conventions.md "KV-cache formats" has the layouts."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import InputError

DS_TILE = 128                 # latent values per fp8_ds_mla scale
PAGED_TILE = 64               # latent values per fp8_ue8m0_paged scale
PAGED_ALIGN = 576             # fp8_ue8m0_paged pages are padded to a multiple of this


@dataclass(frozen=True)
class KvFormat:
    name: str
    quantized: bool           # stored in 8 bits, not in the storage dtype
    needs_descale: bool       # the call passes k_descale
    doc: str
    paged: bool = False       # laid out per page: only whole pages can be decoded

    def width(self, rank: int = 512, rope: int = 64) -> int:
        """Elements of the cache tensor's last dimension (bytes, for an 8-bit format)."""
        if self.name == "fp8_ds_mla":
            return rank + 4 * (rank // DS_TILE) + 2 * rope
        if self.paged:
            return rank + 2 * rope + rank // PAGED_TILE + 1
        return rank + rope

    def tile(self) -> int:
        """Latent values one scale covers (0: none)."""
        return DS_TILE if self.name == "fp8_ds_mla" else PAGED_TILE if self.paged else 0

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
    "fp8_ue8m0_paged": KvFormat("fp8_ue8m0_paged", True, False,
                                "per page: e4m3 latent and bf16 rope rows, then a UE8M0 scale "
                                "per 64 latent values of each token (584 bytes for 448 + 64)",
                                paged=True),
}
FORMATS = tuple(_FORMATS)


def get(name: str) -> KvFormat:
    try:
        return _FORMATS[name]
    except KeyError:
        raise InputError(f"kv_format {name!r} is not one of {', '.join(FORMATS)}") from None
