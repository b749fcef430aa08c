"""A decode shape as the tools take it (`mlagen tune --shape`, `mlagen bench --shape`):
(b, s_q, s_k, h_q, varlen), with the benchmark of record's workload (bench.py) behind it."""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import MlagenError


@dataclass(frozen=True)
class Shape:
    b: int
    s_q: int
    sk: int
    h_q: int
    varlen: bool

    @property
    def rows(self) -> int:
        return self.s_q * self.h_q

    def label(self) -> str:
        return f"{self.b},{self.s_q},{self.sk},{self.h_q}{',varlen' if self.varlen else ''}"


def parse_shape(text: str) -> Shape:
    """"b,s_q,s_k,h_q" or "b,s_q,s_k,h_q,varlen"."""
    parts = [x.strip() for x in text.split(",")]
    try:
        if len(parts) not in (4, 5) or (len(parts) == 5 and parts[4] != "varlen"):
            raise ValueError
        b, s_q, sk, h_q = (int(x) for x in parts[:4])
    except ValueError:
        raise MlagenError(f"shape {text!r}: expected b,s_q,s_k,h_q[,varlen]") from None
    if not (b >= 1 and 1 <= s_q <= 8 and sk >= 1 and 1 <= h_q <= 128):
        raise MlagenError(f"shape {text!r}: needs b >= 1, s_q 1..8, s_k >= 1, h_q 1..128")
    return Shape(b, s_q, sk, h_q, len(parts) == 5)
