"""The SC11 target's knobs: the common ones (records.Mapping) plus these."""

from __future__ import annotations

from dataclasses import dataclass

from ...schedule.records import Mapping, knob

SCHEMES = ("auto", "heads", "batch", "seq", "batch_seq")
GATHERS = ("runs", "token")


@dataclass(frozen=True)
class Sc11Mapping(Mapping):
    cores: int = knob(8, "cores of the chip used (<= the target's cores_per_chip)", tag="c")
    heads_per_core: int = knob(0, "heads one core owns in phases A and C; 0: heads per "
                                  "card / cores", tag="hpc")
    # a run-time argument (``auto`` picks per workload), so one build serves every scheme
    scheme: str = knob("auto", "phase-B multi-core scheme", compile_time=False)
    seq_tile: int = knob(2048, "KV tokens per L2 tile of a sequence", tag="t")
    # compile-time for sparse problems only (variant_parts leaves it out of dense ones)
    gather: str = knob("runs", "sparse: one SDMA descriptor per run of adjacent slots of "
                               "a page (\"runs\") or per token (\"token\")", tag="g")

    def variant_parts(self, s):
        p = s.problem
        # every problem field is a compile-time constant of the emulator kernel
        kv = [f"kv{p.kv.replace('_', '')}"] if p.kv != p.dtype else []   # an 8-bit cache
        # a key shape other than 576 / 512 (the model's latent / rope / V split)
        shape = [f"d{p.d}r{p.rope_dim}v{p.dv}"] if (p.d, p.rope_dim, p.dv) != (576, 64, 512) \
            else []
        sparse = []
        if p.attention == "sparse":
            sparse = [f"sparse{p.topk}"]
            if p.extra_topk:
                sparse.append(f"x{p.extra_topk}pg{p.extra_page_size or p.page_size}")
            if p.sinks:
                sparse.append("sink")
        knobs = super().variant_parts(s)[1:]
        if p.attention != "sparse":
            knobs.remove(f"g{self.gather}")
        return ([s.target.kind, "fused" if p.fused else "attn", p.dtype, *kv, *shape,
                 *sparse, f"h{s.heads_per_device}", f"pg{p.page_size}"] + knobs)
