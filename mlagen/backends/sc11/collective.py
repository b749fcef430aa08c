"""The SC11 timeline of a tensor-parallel step: each card's fused operator, then the o_proj
all-reduce over the card link.

A card's kernel time is the cost model's (simulate(trace)); the slowest card sets when the
partial o_proj products are ready.  The all-reduce is a ring over the tp cards: 2 (tp - 1)
steps, each moving bytes / tp over one link and paying the link latency,

    t_allreduce = 2 (tp - 1) / tp * bytes / link_bw + 2 (tp - 1) * link_latency

Link: no public figure exists for SC11 card-to-card transfers; the only one we have is the
chip-to-chip CDMA figure of targets/sc11.toml (cdma_bw 11.2 GB/s, cdma_latency_s 0.25 us,
secondhand: the source each parameter names there).  The card link is ASSUMED to match it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ...targets import Target

DSV3_HIDDEN = 7168      # DeepSeek-V3's hidden_size: the width of o_proj's output


@dataclass(frozen=True)
class TpStep:
    tp: int
    kernel_s: tuple[float, ...]      # each card's simulated operator time
    allreduce_bytes: int
    allreduce_s: float
    link_bw: float
    link_latency_s: float

    @property
    def total_s(self) -> float:
        return max(self.kernel_s) + self.allreduce_s

    def summary(self) -> str:
        k = max(self.kernel_s)
        lines = [f"TP step over {self.tp} cards (simulated):",
                 f"  fused operator, slowest card   {k * 1e6:10.1f} us  "
                 f"(cards: {', '.join(f'{t * 1e6:.1f}' for t in self.kernel_s)})",
                 f"  o_proj all-reduce (ring)       {self.allreduce_s * 1e6:10.1f} us  "
                 f"({self.allreduce_bytes / 1024:.1f} KiB over a {self.link_bw / 1e9:.1f} GB/s, "
                 f"{self.link_latency_s * 1e6:.2f} us link: ASSUMED = the chip-to-chip CDMA "
                 "figure, secondhand)",
                 f"  step                           {self.total_s * 1e6:10.1f} us  "
                 f"(collective {self.allreduce_s / self.total_s:.0%})"]
        return "\n".join(lines)


def allreduce_seconds(nbytes: int, tp: int, link_bw: float, latency_s: float) -> float:
    if tp <= 1:
        return 0.0
    return 2 * (tp - 1) / tp * nbytes / link_bw + 2 * (tp - 1) * latency_s


def tp_step(kernel_s: Sequence[float], tokens: int, target: Target,
            hidden: int = DSV3_HIDDEN, elem_bytes: int = 2) -> TpStep:
    """The step of `tokens` query rows (batch x s_q) whose o_proj output (tokens x hidden,
    bf16) is all-reduced over len(kernel_s) cards."""
    tp = len(kernel_s)
    nbytes = tokens * hidden * elem_bytes
    bw, lat = float(target.cdma_bw), float(target.cdma_latency_s)
    return TpStep(tp, tuple(float(t) for t in kernel_s), nbytes,
                  allreduce_seconds(nbytes, tp, bw, lat), bw, lat)
