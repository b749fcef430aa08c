"""Rotary position embeddings as models define them: the config, the table, the rotation.

    RopeConfig   the model's rope config: default, linear or YaRN (with its mscale), and the
                 layout of the rotated dims (DeepSeek's interleaved pairs or the half split)
    RotaryTable  cos / sin [rows, rope_dim // 2] indexed by absolute position, as serving
                 engines keep it (fp32); attention_factor (YaRN's mscale) is already in it
    rotate(x, pos, rope)  x [..., rope_dim] rotated at integer positions pos

Both kinds of ``rope`` are accepted wherever a rotation is needed (the reference, the
emulated card's fused operator, the transformers integration).  The formulas are the
papers' (RoPE, linear position interpolation, YaRN: arXiv 2309.00071, with DeepSeek-V2/V3's
mscale and its change of the softmax scale); angles are formed in float64 so positions up
to ~1e6 keep their accuracy.

Layouts of the rotated part x[0:d]:
    "interleaved"  frequency i rotates the pair (x[2i], x[2i+1])        (DeepSeek's reference)
    "half"         frequency i rotates the pair (x[i], x[i + d/2])      (GPT-NeoX, transformers'
                   rotate_half; transformers' rope_interleave=True de-interleaves first and
                   then rotates this way, so its cached k_rot is in this layout)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Union

import torch

from .errors import InputError

__all__ = ["RopeConfig", "RotaryTable", "Rope", "rotate", "cos_sin", "deinterleave_perm",
           "LAYOUTS", "KINDS"]

LAYOUTS = ("interleaved", "half")
KINDS = ("default", "linear", "yarn")


def _mscale(factor: float, m: float = 1.0) -> float:
    """YaRN's attention temperature term 0.1 * m * ln(factor) + 1 (1 for factor <= 1)."""
    return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0


@dataclass(frozen=True)
class RopeConfig:
    """A model's rope config.  ``kind``: default (theta only), linear (positions divided by
    factor), yarn (per-frequency blend of interpolation and extrapolation between the
    beta_fast / beta_slow rotation counts, and an mscale on cos/sin and the softmax scale)."""

    kind: str = "default"
    theta: float = 10000.0
    factor: float = 1.0
    original_max_position_embeddings: int = 4096
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 1.0
    mscale_all_dim: float = 0.0
    attention_factor: Optional[float] = None     # yarn: overrides the mscale ratio
    truncate: bool = True                         # yarn: floor/ceil the correction range
    layout: str = "interleaved"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InputError(f"rope kind {self.kind!r} must be one of {', '.join(KINDS)}")
        if self.layout not in LAYOUTS:
            raise InputError(f"rope layout {self.layout!r} must be one of {', '.join(LAYOUTS)}")
        if not self.theta > 1:
            raise InputError(f"rope theta = {self.theta} must be > 1")
        if self.kind != "default" and not self.factor > 0:
            raise InputError(f"rope factor = {self.factor} must be > 0")
        if self.kind == "yarn" and (self.original_max_position_embeddings < 1
                                    or not self.beta_fast > 0 or not self.beta_slow > 0):
            raise InputError("yarn needs original_max_position_embeddings >= 1 and "
                             "beta_fast, beta_slow > 0")

    # ---- the frequencies ---------------------------------------------------------------
    def inv_freq(self, dim: int) -> torch.Tensor:
        """float64 [dim // 2]: the angle per position of each frequency."""
        _check_dim(dim)
        base = float(self.theta) ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
        if self.kind == "default":
            return base
        if self.kind == "linear":
            return base / self.factor
        # YaRN: frequencies that turn fewer than beta_slow times over the original context
        # are interpolated (divided by factor), those turning more than beta_fast times are
        # kept; a linear ramp over the dims in between.
        def dim_of(rotations: float) -> float:
            return dim * math.log(self.original_max_position_embeddings
                                  / (rotations * 2 * math.pi)) / (2 * math.log(self.theta))
        lo, hi = dim_of(self.beta_fast), dim_of(self.beta_slow)
        if self.truncate:
            lo, hi = math.floor(lo), math.ceil(hi)
        lo, hi = max(lo, 0), min(hi, dim - 1)
        if hi == lo:
            hi += 0.001
        ramp = ((torch.arange(dim // 2, dtype=torch.float64) - lo) / (hi - lo)).clamp(0, 1)
        keep = 1.0 - ramp                       # 1: extrapolate (original frequency)
        return base / self.factor * ramp + base * keep

    @property
    def attention_scaling(self) -> float:
        """The factor on cos and sin (YaRN's mscale ratio; 1 otherwise)."""
        if self.kind != "yarn":
            return 1.0
        if self.attention_factor is not None:
            return float(self.attention_factor)
        if self.mscale and self.mscale_all_dim:
            return _mscale(self.factor, self.mscale) / _mscale(self.factor, self.mscale_all_dim)
        return _mscale(self.factor)

    def softmax_scale(self, qk_head_dim: int) -> float:
        """DeepSeek's softmax scale: qk_head_dim**-0.5, times mscale(factor, mscale_all_dim)**2
        when the config scales rope (DeepSeek-V3: 192**-0.5 * 1.3689**2)."""
        s = float(qk_head_dim) ** -0.5
        if self.kind != "default" and self.mscale_all_dim:
            s *= _mscale(self.factor, self.mscale_all_dim) ** 2
        return s

    # ---- tables ------------------------------------------------------------------------
    def cos_sin(self, pos: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
        """float64 cos, sin [*pos.shape, dim // 2] (attention_scaling applied)."""
        angle = pos.to(torch.float64)[..., None] * self.inv_freq(dim).to(pos.device)
        a = self.attention_scaling
        return torch.cos(angle) * a, torch.sin(angle) * a

    def table(self, rows: int, dim: int, device: Union[str, torch.device] = "cpu"
              ) -> "RotaryTable":
        """The fp32 table of positions 0 .. rows - 1."""
        if rows < 1:
            raise InputError(f"a rotary table needs >= 1 row, got {rows}")
        c, s = self.cos_sin(torch.arange(rows, device=device), dim)
        return RotaryTable(c.float().contiguous(), s.float().contiguous(), self.layout)

    # ---- from a model's config ---------------------------------------------------------
    @staticmethod
    def from_hf(config: Any) -> "RopeConfig":
        """From a transformers config (rope_parameters in 5.x, rope_scaling / rope_theta in
        4.x); the layout from rope_interleave (DeepSeek-V3's configs: True)."""
        params: Mapping[str, Any] = dict(getattr(config, "rope_parameters", None)
                                         or getattr(config, "rope_scaling", None) or {})
        theta = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
        kind = params.get("rope_type", params.get("type", "default"))
        interleave = getattr(config, "rope_interleave", True)
        return RopeConfig.from_dict({**params, "rope_type": kind, "rope_theta": theta},
                                    layout="interleaved" if interleave else "half")

    @staticmethod
    def from_dict(d: Mapping[str, Any], layout: str = "interleaved") -> "RopeConfig":
        """From a rope_scaling / rope_parameters dict ({"type": "yarn", "factor": 40, ...})."""
        kind = d.get("rope_type", d.get("type", "default"))
        if kind not in KINDS:
            raise InputError(f"rope type {kind!r} is not supported (one of {', '.join(KINDS)})")
        def num(key: str, default: float) -> float:
            v = d.get(key)
            return float(default if v is None else v)
        return RopeConfig(
            kind=kind, theta=num("rope_theta", 10000.0), factor=num("factor", 1.0),
            original_max_position_embeddings=int(num("original_max_position_embeddings", 4096)),
            beta_fast=num("beta_fast", 32.0) or 32.0, beta_slow=num("beta_slow", 1.0) or 1.0,
            mscale=num("mscale", 1.0), mscale_all_dim=num("mscale_all_dim", 0.0),
            attention_factor=d.get("attention_factor"), truncate=bool(d.get("truncate", True)),
            layout=layout)


@dataclass(frozen=True, eq=False)
class RotaryTable:
    """cos, sin fp32 [rows, rope_dim // 2]: row p holds position p's angles (with any
    attention scaling already multiplied in)."""

    cos: torch.Tensor
    sin: torch.Tensor
    layout: str = "interleaved"

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise InputError(f"rope layout {self.layout!r} must be one of {', '.join(LAYOUTS)}")
        if self.cos.dim() != 2 or self.cos.shape != self.sin.shape or self.cos.shape[0] < 1:
            raise InputError(f"a rotary table is cos, sin [rows, rope_dim / 2]; got "
                             f"{tuple(self.cos.shape)} and {tuple(self.sin.shape)}")

    @property
    def rows(self) -> int:
        return self.cos.shape[0]

    @property
    def half_dim(self) -> int:
        return self.cos.shape[1]


Rope = Union[RopeConfig, RotaryTable]


def _check_dim(dim: int) -> None:
    if dim <= 0 or dim % 2:
        raise InputError(f"rope_dim = {dim} must be even and > 0")


def cos_sin(rope: Rope, pos: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [*pos.shape, dim // 2] (float64 from a config, the table's fp32 from a table).
    A negative position (a query row of a sequence shorter than s_q, which sees keys when
    attention is not causal) turns by the negative angle, as a config's angle pos * freq
    does: a table gives row |pos| with its sine negated.  A table must hold every position
    asked for, and every |pos| of a row that sees a key; a negative position past the table
    (only a row that sees no key can be there: the callers that know who sees what check
    it) turns by nothing."""
    _check_dim(dim)
    if isinstance(rope, RopeConfig):
        return rope.cos_sin(pos, dim)
    if rope.half_dim != dim // 2:
        raise InputError(f"the rotary table has {rope.half_dim} frequencies; rope_dim {dim} "
                         f"needs {dim // 2}")
    p = pos.long()
    if p.numel() and int(p.max()) >= rope.rows:
        raise InputError(f"position {int(p.max())} is past the rotary table's "
                         f"{rope.rows} rows")
    dev = rope.cos.device
    neg = (p < 0).to(dev)[..., None]
    past = (-p >= rope.rows).to(dev)[..., None]
    idx = torch.where(p.abs() < rope.rows, p.abs(), 0).to(dev)
    c = torch.where(past, 1.0, rope.cos[idx])
    s = torch.where(past, 0.0, torch.where(neg, -rope.sin[idx], rope.sin[idx]))
    return c, s


def rotate(x: torch.Tensor, pos: torch.Tensor, rope: Rope) -> torch.Tensor:
    """x [..., d] rotated at positions pos (broadcastable to x.shape[:-1]), in x's dtype
    (the products are formed in that dtype; the reference passes fp32 or fp64)."""
    d = x.shape[-1]
    c, s = cos_sin(rope, pos, d)
    c, s = c.to(x.device, x.dtype), s.to(x.device, x.dtype)
    if rope.layout == "interleaved":
        pairs = x.reshape(*x.shape[:-1], d // 2, 2)
        x0, x1 = pairs[..., 0], pairs[..., 1]
        return torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).reshape(x.shape)
    x0, x1 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1)


def deinterleave_perm(dim: int) -> torch.Tensor:
    """The column order [0, 2, 4, ..., 1, 3, ...]: x[..., perm] turns interleaved pairs into
    the half layout (what transformers does to DeepSeek's weights when rope_interleave)."""
    _check_dim(dim)
    return torch.cat((torch.arange(0, dim, 2), torch.arange(1, dim, 2)))
