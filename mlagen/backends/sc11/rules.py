"""The SC11 target's rules (run after the common ones in mlagen/schedule/rules.py)."""

from __future__ import annotations

from typing import Iterator

from ...errors import clip
from ...formats import PAGED_ALIGN
from ...schedule.records import Schedule
from ...targets import Target
from .knobs import GATHERS, SCHEMES

Violation = tuple[str, str, str]
# fp8_ue8m0_paged's token on sc11: a data row of kv_lora_rank e4m3 and rope_dim bf16 values
# exactly one page-alignment unit (448 + 2 * 64 = 576 bytes), the shape its layout is for
PAGED_SHAPE = (448, 64)


def sc11_mapping(s: Schedule, t: Target) -> Iterator[Violation]:
    p, m = s.problem, s.mapping
    if not 1 <= m.buffers <= 3:
        yield "schedule", "buffers", f"buffers = {m.buffers} must be 1, 2 or 3"
    cores = int(t.cores_per_chip)
    if not 1 <= m.cores <= cores:
        yield "schedule", "cores", f"cores = {m.cores} must be between 1 and {cores} (cores per chip)"
    if m.scheme not in SCHEMES:
        yield "schedule", "scheme", f"scheme = {clip(repr(m.scheme))} must be one of {', '.join(SCHEMES)}"
    if m.gather not in GATHERS:
        yield "schedule", "gather", (f"gather = {clip(repr(m.gather))} must be "
                                     f"{' or '.join(repr(g) for g in GATHERS)}")
    if m.tp < 1 or p.heads % m.tp:
        return
    hpd = s.heads_per_device
    if m.heads_per_core < 0:
        yield "schedule", "heads_per_core", f"heads_per_core = {m.heads_per_core} must be >= 0"
    elif m.heads_per_core:
        if hpd % m.heads_per_core:
            yield "schedule", "heads_per_core", (
                f"heads_per_core = {m.heads_per_core} must divide the heads per card "
                f"({p.heads} / tp {m.tp} = {hpd})")
        elif hpd // m.heads_per_core > m.cores:
            yield "schedule", "heads_per_core", (
                f"heads_per_core = {m.heads_per_core} needs {hpd // m.heads_per_core} cores "
                f"for {hpd} heads but cores = {m.cores}")
    if m.block_kv >= 1 and (m.seq_tile < 1 or m.seq_tile % m.block_kv):
        yield "schedule", "seq_tile", (f"seq_tile = {m.seq_tile} must be a positive "
                                       f"multiple of block_kv = {m.block_kv}")
    if m.block_kv > 1024:
        yield "schedule", "block_kv", f"block_kv = {m.block_kv} must be <= 1024 on sc11"
    if p.fused and p.v_dim not in (0, p.kv_lora_rank):
        # phase B's latent output is the whole latent; W_UV takes all kv_lora_rank values
        yield "problem", "v_dim", (f"v_dim = {p.v_dim}: sc11's fused operator attends with "
                                   f"V = the whole latent (v_dim = 0 or kv_lora_rank = "
                                   f"{p.kv_lora_rank})")
    if p.kv in ("fp8_ds_mla", "fp8_ue8m0_paged") and p.dtype != "bf16":
        # its rope values are bf16, and e4m3 times a power-of-two scale is exact in bf16 only
        yield "problem", "kv_format", (f"kv_format = \"{p.kv}\" needs dtype = \"bf16\" "
                                       f"on sc11 (its dequantized tile is bf16), got "
                                       f"{p.dtype!r}")


def sc11_sparse(s: Schedule, t: Target) -> Iterator[Violation]:
    """What the sparse path (mla.h) reads (attention-only or the fused operator): 16-bit, fp8_ds_mla or
    fp8_ue8m0_paged pools (the last in its one shape), both pools in one format (one token
    size in the L2 tile).  fp8_ue8m0_paged is read by the sparse path only."""
    p = s.problem
    if p.attention != "sparse":
        if p.kv == "fp8_ue8m0_paged":
            yield "problem", "kv_format", ("kv_format = \"fp8_ue8m0_paged\": sc11 reads it "
                                           "on the sparse path only (attention = \"sparse\")")
        return
    readable = ("bf16", "fp16", "fp8_ds_mla", "fp8_ue8m0_paged")
    if p.kv not in readable:
        yield "problem", "kv_format", (f"kv_format = {p.kv!r}: sc11's sparse path reads "
                                       f"{', '.join(readable)} pools")
    elif p.kv == "fp8_ue8m0_paged" and (p.kv_lora_rank, p.rope_dim) != PAGED_SHAPE:
        yield "problem", "kv_format", (
            f"kv_format = \"fp8_ue8m0_paged\" on sc11 needs kv_lora_rank = {PAGED_SHAPE[0]} "
            f"and rope_dim = {PAGED_SHAPE[1]} (its {PAGED_ALIGN}-byte data row, d = "
            f"{sum(PAGED_SHAPE)}), got {p.kv_lora_rank} + {p.rope_dim}")
    if p.extra_topk and p.extra_kv != p.kv:
        yield "problem", "extra_kv_format", (
            f"extra_kv_format = {p.extra_kv!r} differs from kv_format = {p.kv!r}: sc11 "
            "gathers both pools into one tile of one token size")


RULES = [sc11_mapping, sc11_sparse]
