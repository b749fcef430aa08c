"""The schedule as plain, immutable records.

A schedule file has three tables, each parsed into one record here:

    [problem]   what is computed (MLA shapes, page size, dtype, fused or attention-only)
    [target]    where it runs (a target kind and, optionally, its description file)
    [schedule]  how it is mapped: the knobs every target has (``Mapping``) plus the knobs of
                the target's own record, a subclass of ``Mapping`` its backend declares
                (mlagen/backends/<kind>/knobs.py)

Records hold values only; the common rules live in ``rules.py``, a target's rules and
resource counts in its backend.  No target is named here and no backend is looked up: the
parser (``parse.py``) picks a schedule's knob record by its kind, and the record names the
build (``Mapping.variant_parts``), so this module sits below the backends that subclass it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

DTYPES = ("bf16", "fp16")
ATTENTIONS = ("dense", "sparse")
# Planted faults for the verifier's own tests.  They are not
# schedule-file keys: only ``Schedule.with_fault`` sets one.
FAULTS = (
    "none",
    "causal_off_by_one",   # a query sees one key too many
    "wrong_scale",         # softmax scale multiplied by 1.01
    "skip_partial_page",   # the last, partial page of a sequence is ignored
    "bad_split_merge",     # partial results summed without their lse weights
    "early_buffer_swap",   # double buffer handed to compute one step early
    # faults in paths only some compile-time values reach (the emulator's path tests)
    "proj_first_chunk_only",    # fused: phases A / C stop after 128 token rows
    "ignore_softmax_scale",     # the convention's default scale instead of the caller's
    "page_start_assumed",       # a KV tile starting mid-page is gathered from the page start
    "empty_partial_unmasked",   # the merge weighs a partial whose row saw no key as lse 0
    "default_head_split",       # phases A / C give a core heads / cores, not heads_per_core
    # faults in the dequantization of 8-bit KV caches (kv_format fp8_e4m3 / fp8_ds_mla)
    "kv_scale_twice",           # a KV scale applied twice (k_descale, or a tile's scale)
    "kv_scale_wrong_tile",      # fp8_ds_mla: a 128-value tile dequantized with the next one's scale
    "descale_not_in_output",    # fp8_e4m3: k_descale in the scores but not in the output
    # faults in the token-sparse path (attention = "sparse")
    "sparse_offset_off_by_one",      # a slot's offset within its page taken one further
    "sparse_invalid_read",           # a negative (invalid) index read as slot 0
    "sparse_topk_length_plus_one",   # topk_length + 1 entries of an index list kept
    "sink_in_lse",                   # the sink also added into the lse
    "sink_sign",                     # the output scaled with exp(-sink)
    "extra_page_for_main",           # the main pool's slots split by the extra pool's page size
)
# the faults every build can reach (the rest need their path's compile-time values)
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
    kv_format: str = ""           # how the cache stores a token (mlagen.kvformat); "": dtype
    v_dim: int = 0                # V's width: the first v_dim values of a key; 0: kv_lora_rank
    # token-sparse attention: each query row attends to the topk cache slots it names
    attention: str = "dense"      # "dense" (every key of the sequence) or "sparse"
    topk: int = 0                 # sparse: slots named per query row (the main pool)
    extra_topk: int = 0           # sparse: slots of a second pool in the same softmax; 0: none
    extra_page_size: int = 0      # the second pool's page size; 0: page_size
    extra_kv_format: str = ""     # the second pool's format; "": kv_format
    sinks: bool = False           # per-head sink logits scale the output (FlashMLA's attn_sink)

    @property
    def d(self) -> int:
        return self.kv_lora_rank + self.rope_dim

    @property
    def dv(self) -> int:
        return self.v_dim or self.kv_lora_rank

    @property
    def extra_kv(self) -> str:
        """The second pool's format."""
        return self.extra_kv_format or self.kv

    @property
    def kv(self) -> str:
        """The KV-cache format's name: kv_format, or the storage dtype when it is empty."""
        return self.kv_format or self.dtype

    def default_scale(self) -> float:
        """FlashMLA's d**-0.5 for attention-only; (nope + rope)**-0.5 for the fused operator."""
        if self.softmax_scale is not None:
            return self.softmax_scale
        if self.fused:
            return float((self.qk_nope_head_dim + self.rope_dim) ** -0.5)
        return float(self.d ** -0.5)


@dataclass(frozen=True)
class TargetRef:
    kind: str                      # the target kind (a backend)
    file: str | None = None        # a target description; None: the backend's default file

    @property
    def name(self) -> str:
        """The kind, under the [target] key's old name."""
        return self.kind


def knob(default: Any, doc: str = "", *, compile_time: bool = True, tag: str | None = None
         ) -> Any:
    """A mapping knob: its default, what it means, whether the kernel bakes it in
    (``compile_time``: part of the variant name and the build) and its short tag in the
    variant name (``bkv`` for block_kv; None: the field's name)."""
    return field(default=default, metadata={"doc": doc, "compile_time": compile_time,
                                            "tag": tag})


@dataclass(frozen=True)
class Mapping:
    """The knobs every target has.  A backend's knob record subclasses this one."""

    tp: int = knob(1, "devices (cards / GPUs) the heads are split over", compile_time=False)
    block_kv: int = knob(64, "KV tokens per block the kernel works on", tag="bkv")
    buffers: int = knob(2, "KV buffers / pipeline stages", tag="buf")

    def variant_parts(self, s: "Schedule") -> list[str]:
        """The words of s's variant name: its kind, then every compile-time knob as
        ``<tag><value>``.  A target's record adds the problem fields its kernels are
        compiled with."""
        parts = [s.target.kind]
        for f in dataclasses.fields(self):
            if f.metadata.get("compile_time", True):
                value = getattr(self, f.name)
                tag = f.metadata.get("tag")
                parts.append(f"{f.name if tag is None else tag}{str(value).replace('_', '')}")
        return parts


@dataclass(frozen=True)
class Schedule:
    problem: Problem = field(default_factory=Problem)
    # no defaults: the kind and its knob record come from a file or Schedule.build
    target: TargetRef = field(kw_only=True)
    mapping: Mapping = field(kw_only=True)
    name: str = "unnamed"          # the schedule's name: file stem or given by the builder
    source: str | None = None      # the file it came from, for messages
    fault: str = "none"            # planted fault; internal, never read from a file

    # ---- builder API -------------------------------------------------------------
    # Set by mlagen.schedule (the parser and checker sit above this module): one path
    # for files and for schedules made in Python.
    _builder: ClassVar[Callable[..., "Schedule"] | None] = None

    @staticmethod
    def build(name: str = "unnamed", target: str | None = None,
              target_file: str | None = None, **knobs: Any) -> "Schedule":
        """Make a schedule from keyword knobs: problem and mapping fields by name.

        ``Schedule.build(target=KIND, heads=128, tp=4, block_kv=64)``
        makes the same record as the equivalent file, checked the same way.
        """
        assert Schedule._builder is not None, "import mlagen.schedule first"
        return Schedule._builder(name=name, target=target, target_file=target_file, **knobs)

    def replace(self, **knobs: Any) -> "Schedule":
        """A copy with problem or mapping knobs replaced (no checks: call rules.check)."""
        problem_names = {f.name for f in dataclasses.fields(Problem)}
        mapping_names = {f.name for f in dataclasses.fields(self.mapping)}
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
        """A readable name that spells out what the kernel is compiled with (the target's
        knob record says which fields those are): schedules that compile the same share it."""
        parts = self.mapping.variant_parts(self)
        if self.fault != "none":
            parts.append("FAULT-" + self.fault.replace("_", "-"))
        return "_".join(parts)
