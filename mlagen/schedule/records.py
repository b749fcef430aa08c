"""The schedule as plain, immutable records.

A schedule file has three tables, each parsed into one record here:

    [problem]   what is computed (MLA shapes, page size, dtype, fused or attention-only)
    [target]    where it runs (a target name and the description file in targets/)
    [schedule]  how it is mapped (tp, cores, block_kv, buffers, split-KV, tiles ...)

Records hold values only; every check with its message lives in ``rules.py`` and every
resource count in ``resources.py``.  A knob that one target does not use keeps its default
and the rules reject a non-default value for the wrong target.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Union

DTYPES = ("bf16", "fp16")
SC11_SCHEMES = ("auto", "heads", "batch", "seq", "batch_seq")
HOPPER_MAINLOOPS = ("mma_sync", "wgmma")

# Planted faults for the verifier's own tests (issue: verifier power).  They are not
# schedule-file keys: only ``Schedule.with_fault`` sets one.
FAULTS = (
    "none",
    "causal_off_by_one",   # a query sees one key too many
    "wrong_scale",         # softmax scale multiplied by 1.01
    "skip_partial_page",   # the last, partial page of a sequence is ignored
    "bad_split_merge",     # partial results summed without their lse weights
    "early_buffer_swap",   # double buffer handed to compute one step early
    # SC11 faults in paths only some compile-time values reach (tests/test_sc11_paths.py)
    "proj_first_chunk_only",    # fused: phases A / C stop after 128 token rows
    "ignore_softmax_scale",     # the convention's default scale instead of the caller's
    "page_start_assumed",       # a KV tile starting mid-page is gathered from the page start
    "empty_partial_unmasked",   # the merge weighs a partial whose row saw no key as lse 0
    "default_head_split",       # phases A / C give a core heads / cores, not heads_per_core
)
# the faults every SC11 build can reach (the rest need the path's compile-time values)
BASIC_FAULTS = FAULTS[1:6]


@dataclass(frozen=True)
class Problem:
    """The MLA decode problem (DeepSeek-V3 defaults)."""

    heads: int = 128              # query heads of the whole model layer, before tp
    kv_lora_rank: int = 512       # latent rank (the V width, dv)
    rope_dim: int = 64            # RoPE part of the key; d = kv_lora_rank + rope_dim
    qk_nope_head_dim: int = 128
    v_head_dim: int = 128
    q_lora_rank: int = 1536
    page_size: int = 64
    dtype: str = "bf16"
    max_s_q: int = 1              # query tokens per sequence per step (MTP / spec decode)
    fused: bool = False           # up-projections (W_UQ, W_UK, W_UV) fused into the kernel
    softmax_scale: float | None = None   # None: the convention's default (see default_scale)
    h_kv: int = 1
    causal: bool = True

    @property
    def d(self) -> int:
        return self.kv_lora_rank + self.rope_dim

    @property
    def dv(self) -> int:
        return self.kv_lora_rank

    def default_scale(self) -> float:
        """FlashMLA's d**-0.5 for attention-only; (nope + rope)**-0.5 for the fused operator."""
        if self.softmax_scale is not None:
            return self.softmax_scale
        if self.fused:
            return float((self.qk_nope_head_dim + self.rope_dim) ** -0.5)
        return float(self.d ** -0.5)


@dataclass(frozen=True)
class TargetRef:
    name: str = "sc11"
    file: str | None = None        # a target description; None: targets/<name>.toml


@dataclass(frozen=True)
class Mapping:
    """How the problem is mapped onto the target.  Knobs of both targets; see rules.py."""

    # common
    tp: int = 1                    # devices (cards / GPUs) the heads are split over
    block_kv: int = 64             # KV tokens per block the kernel works on
    buffers: int = 2               # SC11: KV buffers in L2/LMEM; Hopper: pipeline stages
    split_kv: Union[int, str] = "auto"   # partial-KV splits per sequence, or "auto"
    # SC11
    cores: int = 8                 # cores of the chip used (<= target cores)
    heads_per_core: int = 0        # 0: heads per card / cores (phase A and C)
    scheme: str = "auto"           # phase B multi-core scheme
    seq_tile: int = 2048           # KV tokens per L2 tile of a sequence
    # Hopper
    rows_per_tile: int = 32        # query rows (s_q * h_q packed) per CTA tile
    warps: int = 8                 # warps per CTA (mma_sync main loop)
    mainloop: str = "mma_sync"


@dataclass(frozen=True)
class Schedule:
    problem: Problem = field(default_factory=Problem)
    target: TargetRef = field(default_factory=TargetRef)
    mapping: Mapping = field(default_factory=Mapping)
    name: str = "unnamed"          # the schedule's name: file stem or given by the builder
    source: str | None = None      # the file it came from, for messages
    fault: str = "none"            # planted fault; internal, never read from a file

    # ---- builder API -------------------------------------------------------------
    @staticmethod
    def build(name: str = "unnamed", target: str = "sc11", target_file: str | None = None,
              **knobs: Any) -> "Schedule":
        """Make a schedule from keyword knobs: problem and mapping fields by name.

        ``Schedule.build(target="sc11", heads=128, tp=4, block_kv=64, scheme="seq")``
        makes the same record as the equivalent file; it is checked by ``rules.check``.
        """
        from .parse import schedule_from_tables  # one path for files and builders

        problem_names = {f.name for f in dataclasses.fields(Problem)}
        tables: dict[str, dict[str, Any]] = {"problem": {}, "target": {"name": target},
                                              "schedule": {}}
        if target_file is not None:
            tables["target"]["file"] = target_file
        for key, value in knobs.items():
            tables["problem" if key in problem_names else "schedule"][key] = value
        return schedule_from_tables(tables, source=None, name=name)

    def replace(self, **knobs: Any) -> "Schedule":
        """A copy with problem or mapping knobs replaced (no checks: call rules.check)."""
        problem_names = {f.name for f in dataclasses.fields(Problem)}
        mapping_names = {f.name for f in dataclasses.fields(Mapping)}
        p = {k: v for k, v in knobs.items() if k in problem_names}
        m = {k: v for k, v in knobs.items() if k in mapping_names}
        other = set(knobs) - problem_names - mapping_names
        if other:
            raise TypeError(f"unknown knobs: {sorted(other)}")
        return dataclasses.replace(self, problem=dataclasses.replace(self.problem, **p),
                                   mapping=dataclasses.replace(self.mapping, **m))

    def with_fault(self, fault: str) -> "Schedule":
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; one of {FAULTS}")
        return dataclasses.replace(self, fault=fault)

    # ---- derived -----------------------------------------------------------------
    @property
    def heads_per_device(self) -> int:
        return self.problem.heads // self.mapping.tp

    def variant_name(self) -> str:
        """A readable name that spells out the knobs that change the generated code."""
        p, m = self.problem, self.mapping
        parts = [self.target.name, "fused" if p.fused else "attn", p.dtype,
                 f"h{self.heads_per_device}", f"pg{p.page_size}", f"bkv{m.block_kv}",
                 f"buf{m.buffers}"]
        if self.target.name == "sc11":
            # the multi-core scheme is a run-time argument (``auto`` picks per workload),
            # so one build serves every scheme
            parts += [f"c{m.cores}", f"t{m.seq_tile}"]
        else:
            parts += [m.mainloop.replace("_", ""), f"r{m.rows_per_tile}", f"w{m.warps}"]
        if self.fault != "none":
            parts.append("FAULT-" + self.fault.replace("_", "-"))
        return "_".join(parts)
