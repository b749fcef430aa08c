"""Every rule a schedule must keep, each with the message it gives when broken.

A rule is a function ``rule(schedule, target) -> Iterator[(table, key, message)]``; ``check``
runs them in order and raises the first failure at the line of the offending key.  The
resource rules (does it fit in shared memory / LMEM ...) are in resources.py and run last.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Iterator

from ..errors import ResourceError, TargetError
from ..targets import Target, load_target, target_path
from .records import DTYPES, HOPPER_MAINLOOPS, SC11_SCHEMES, Mapping, Schedule

Violation = tuple[str, str, str]
Rule = Callable[[Schedule, Target], Iterator[Violation]]

RULES: list[Rule] = []


def rule(fn: Rule) -> Rule:
    RULES.append(fn)
    return fn


def _divisors_hint(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


# ---------------------------------------------------------------- problem ----------
@rule
def problem_shapes(s: Schedule, t: Target) -> Iterator[Violation]:
    p = s.problem
    if not 1 <= p.heads <= 128:
        yield "problem", "heads", f"heads = {p.heads} must be between 1 and 128"
    if p.kv_lora_rank <= 0 or p.kv_lora_rank % 64:
        yield "problem", "kv_lora_rank", \
            f"kv_lora_rank = {p.kv_lora_rank} must be a positive multiple of 64"
    if p.rope_dim < 0 or p.rope_dim % 16:
        yield "problem", "rope_dim", f"rope_dim = {p.rope_dim} must be a multiple of 16 (>= 0)"
    if p.fused and (p.rope_dim == 0 or p.rope_dim % 2):
        yield "problem", "rope_dim", "a fused operator applies RoPE: rope_dim must be even and > 0"
    for key in ("qk_nope_head_dim", "v_head_dim", "q_lora_rank"):
        v = getattr(p, key)
        if v <= 0 or v % 16:
            yield "problem", key, f"{key} = {v} must be a positive multiple of 16"
    if not 1 <= p.page_size <= 256:
        yield "problem", "page_size", f"page_size = {p.page_size} must be between 1 and 256"
    if p.dtype not in DTYPES:
        yield "problem", "dtype", f"dtype = {p.dtype!r} must be one of {', '.join(DTYPES)}"
    if not 1 <= p.max_s_q <= 8:
        yield "problem", "max_s_q", f"max_s_q = {p.max_s_q} must be between 1 and 8"
    if p.softmax_scale is not None and not (p.softmax_scale > 0 and
                                            math.isfinite(p.softmax_scale)):
        yield "problem", "softmax_scale", \
            f"softmax_scale = {p.softmax_scale} must be a finite number > 0"
    if p.h_kv != 1:
        yield "problem", "h_kv", f"h_kv = {p.h_kv}: MLA has one latent KV head; h_kv must be 1"


# ---------------------------------------------------------------- target -----------
@rule
def target_kind(s: Schedule, t: Target) -> Iterator[Violation]:
    if t.kind != s.target.name:
        yield "target", "name", (f"name = {s.target.name!r} but the description "
                                 f"{t.path} is a {t.kind!r} target")
    if s.problem.fused and t.kind == "hopper":
        yield "problem", "fused", ("fused = true is not available on target hopper "
                                   "(attention-only, FlashMLA's API); use target sc11")


# ---------------------------------------------------------------- mapping ----------
@rule
def common_mapping(s: Schedule, t: Target) -> Iterator[Violation]:
    p, m = s.problem, s.mapping
    if m.tp < 1:
        yield "schedule", "tp", f"tp = {m.tp} must be >= 1"
    elif p.heads % m.tp:
        yield "schedule", "tp", (f"tp = {m.tp} must divide heads = {p.heads} "
                                 f"(divisors: {_divisors_hint(p.heads)})")
    if m.block_kv < 1:
        yield "schedule", "block_kv", f"block_kv = {m.block_kv} must be >= 1"
    elif p.page_size % m.block_kv and m.block_kv % p.page_size:
        yield "schedule", "block_kv", (f"block_kv = {m.block_kv} must divide page_size = "
                                       f"{p.page_size} or be a multiple of it")
    # hopper's cp.async pipeline takes more stages (hopper_mapping)
    if t.kind != "hopper" and not 1 <= m.buffers <= 3:
        yield "schedule", "buffers", f"buffers = {m.buffers} must be 1, 2 or 3"
    if isinstance(m.split_kv, str):
        if m.split_kv != "auto":
            yield "schedule", "split_kv", f"split_kv = {m.split_kv!r} must be \"auto\" or an integer"
    elif not 1 <= m.split_kv <= 64:
        yield "schedule", "split_kv", f"split_kv = {m.split_kv} must be between 1 and 64"


_SC11_ONLY = ("cores", "heads_per_core", "scheme", "seq_tile")
# split_kv is hopper's: on sc11 the phase-B scheme decides how a sequence is cut over cores
_HOPPER_ONLY = ("rows_per_tile", "warps", "mainloop", "split_kv")
_WHY_FOREIGN = {"split_kv": " (its multi-core scheme splits sequences; see scheme)"}


@rule
def foreign_knobs(s: Schedule, t: Target) -> Iterator[Violation]:
    """A knob of the other target set on this one is a mistake, not something to ignore."""
    defaults = Mapping()
    foreign = _HOPPER_ONLY if t.kind == "sc11" else _SC11_ONLY
    for key in foreign:
        if getattr(s.mapping, key) != getattr(defaults, key):
            yield "schedule", key, (f"{key} is not a knob of target {t.kind}"
                                    + (_WHY_FOREIGN.get(key, "") if t.kind == "sc11" else ""))


@rule
def sc11_mapping(s: Schedule, t: Target) -> Iterator[Violation]:
    if t.kind != "sc11":
        return
    p, m = s.problem, s.mapping
    cores = int(t.cores_per_chip)
    if not 1 <= m.cores <= cores:
        yield "schedule", "cores", f"cores = {m.cores} must be between 1 and {cores} (cores per chip)"
    if m.scheme not in SC11_SCHEMES:
        yield "schedule", "scheme", f"scheme = {m.scheme!r} must be one of {', '.join(SC11_SCHEMES)}"
    if p.heads % m.tp:
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
    if m.seq_tile < 1 or m.seq_tile % m.block_kv:
        yield "schedule", "seq_tile", (f"seq_tile = {m.seq_tile} must be a positive "
                                       f"multiple of block_kv = {m.block_kv}")
    if m.block_kv > 1024:
        yield "schedule", "block_kv", f"block_kv = {m.block_kv} must be <= 1024 on sc11"


HOPPER_MAX_STAGES = 8   # mla_split.cuh's static_assert


@rule
def hopper_mapping(s: Schedule, t: Target) -> Iterator[Violation]:
    if t.kind != "hopper":
        return
    p, m = s.problem, s.mapping
    if (p.kv_lora_rank, p.rope_dim) != (512, 64):
        yield "problem", "kv_lora_rank", ("the hopper kernels are built for kv_lora_rank = 512 "
                                          "and rope_dim = 64")
    if m.mainloop not in HOPPER_MAINLOOPS:
        yield "schedule", "mainloop", (f"mainloop = {m.mainloop!r} must be one of "
                                       f"{', '.join(HOPPER_MAINLOOPS)}")
    elif m.mainloop == "wgmma":
        # mla_wgmma.cuh: 64-row tiles, 64-key blocks (one TMA box of one page), 2 K stages,
        # two consumer warpgroups (8 warps) beside the producer
        for key, want in (("rows_per_tile", 64), ("block_kv", 64), ("buffers", 2),
                          ("warps", 8)):
            if getattr(m, key) != want:
                yield "schedule", key, (f"{key} = {getattr(m, key)}: mainloop = \"wgmma\" "
                                        f"needs {key} = {want}")
        if p.page_size % 64:
            yield "problem", "page_size", (f"page_size = {p.page_size}: mainloop = \"wgmma\" "
                                           "needs a multiple of 64 (a 64-key block is one TMA "
                                           "box of one page); use mainloop = \"mma_sync\"")
    if m.rows_per_tile not in (16, 32, 64):
        yield "schedule", "rows_per_tile", f"rows_per_tile = {m.rows_per_tile} must be 16, 32 or 64"
    if m.warps not in (4, 8):
        yield "schedule", "warps", f"warps = {m.warps} must be 4 or 8"
    if m.block_kv not in (16, 32, 64):
        yield "schedule", "block_kv", f"block_kv = {m.block_kv} must be 16, 32 or 64 on hopper"
    if not 1 <= m.buffers <= HOPPER_MAX_STAGES:
        yield "schedule", "buffers", (f"buffers = {m.buffers} must be 1..{HOPPER_MAX_STAGES} "
                                      "(cp.async pipeline stages) on hopper")


def violations(s: Schedule, t: Target) -> list[Violation]:
    out: list[Violation] = []
    for r in RULES:
        out.extend(r(s, t))
    return out


def check(s: Schedule, loc=None) -> Target:
    """Raise ScheduleError for the first broken rule (then the resource check); return the
    target the schedule was checked against."""
    from .parse import Located
    from .resources import can_implement

    loc = loc or Located(s.source, {})
    base = Path(s.source).resolve().parent if s.source else None
    if s.target.file is not None and not target_path(s.target.name, s.target.file,
                                                     base).exists():
        raise loc.error("target", "file", (
            f"file = {s.target.file!r}: no such target description (looked in "
            + ("the schedule's folder, " if base else "")
            + "the working directory, the repository and targets/)"))
    try:
        t = load_target(s.target.name, s.target.file, base)
    except TargetError as e:
        raise loc.error("target", "file" if s.target.file else "name", str(e)) from None
    # first broken rule only: later rules may assume what earlier ones checked (tp >= 1)
    for r in RULES:
        for table, key, message in r(s, t):
            raise loc.error(table, key, message)
    report = can_implement(s, t)
    if not report.ok:
        raise loc.error("schedule", report.worst_key, report.message(), cls=ResourceError)
    return t
