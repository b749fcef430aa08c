"""The rules every schedule keeps, each with the message it gives when broken, and
``check``, which runs them, then the target's own rules (its backend's ``rules()``), then
the resource count, and returns the checked ``Plan``.

A rule is a function ``rule(schedule, target) -> Iterator[(table, key, message)]``; the
first failure is raised at the line of the offending key.
"""

from __future__ import annotations

import math
import os
import threading
from pathlib import Path
from typing import Callable, Iterator, Union

from .. import formats
from ..backends import backend, load_target, target_path
from ..errors import ResourceError, TargetError, clip
from ..formats import FORMATS
from ..targets import Target
from .located import Located
from .plan import Plan
from .records import ATTENTIONS, DTYPES, Schedule
from .resources import ResourceReport

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
        yield "problem", "dtype", f"dtype = {clip(repr(p.dtype))} must be one of {', '.join(DTYPES)}"
    if not 1 <= p.max_s_q <= 8:
        yield "problem", "max_s_q", f"max_s_q = {p.max_s_q} must be between 1 and 8"
    if p.softmax_scale is not None and not (p.softmax_scale > 0 and
                                            math.isfinite(p.softmax_scale)):
        yield "problem", "softmax_scale", \
            f"softmax_scale = {p.softmax_scale} must be a finite number > 0"
    if p.h_kv != 1:
        yield "problem", "h_kv", f"h_kv = {p.h_kv}: MLA has one latent KV head; h_kv must be 1"
    if p.kv_format and p.kv_format not in FORMATS:
        yield "problem", "kv_format", (f"kv_format = {p.kv_format!r} must be one of "
                                       f"{', '.join(FORMATS)} (or absent: the dtype)")
    elif p.kv in ("bf16", "fp16") and p.kv != p.dtype:
        yield "problem", "kv_format", (f"kv_format = {p.kv_format!r} with dtype = "
                                       f"{p.dtype!r}: a 16-bit cache is stored in the dtype")
    elif formats.get(p.kv).tile() and p.kv_lora_rank % formats.get(p.kv).tile():
        tile = formats.get(p.kv).tile()
        yield "problem", "kv_format", (f"kv_format = \"{p.kv}\" scales {tile} latent values "
                                       f"at a time: kv_lora_rank = {p.kv_lora_rank} must be a "
                                       f"multiple of {tile}")


# ---------------------------------------------------------------- target -----------
@rule
def target_kind(s: Schedule, t: Target) -> Iterator[Violation]:
    if t.kind != s.target.kind:
        yield "target", "kind", (f"kind = {clip(repr(s.target.kind))} but the description "
                                 f"{t.path} is a {t.kind!r} target")


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


@rule
def sparse_problem(s: Schedule, t: Target) -> Iterator[Violation]:
    p = s.problem
    if not 0 <= p.v_dim <= p.d:
        yield "problem", "v_dim", f"v_dim = {p.v_dim} must lie in [0, d = {p.d}] (0: kv_lora_rank)"
    if p.attention not in ATTENTIONS:
        yield "problem", "attention", (f"attention = {p.attention!r} must be one of "
                                       f"{', '.join(ATTENTIONS)}")
        return
    sparse_keys = ("topk", "extra_topk", "extra_page_size", "extra_kv_format", "sinks")
    if p.attention == "dense":
        for key in sparse_keys:
            if getattr(p, key):
                yield "problem", key, (f"{key} is a sparse attention's; attention = \"dense\" "
                                       "attends to every key of the sequence")
        return
    if not 1 <= p.topk <= 65536:
        yield "problem", "topk", f"topk = {p.topk} must be between 1 and 65536 (attention = \"sparse\")"
    if p.causal:
        yield "problem", "causal", ("attention = \"sparse\" names its keys: causal must be "
                                    "false (FlashMLA's rule)")
    if not 0 <= p.extra_topk <= 65536:
        yield "problem", "extra_topk", f"extra_topk = {p.extra_topk} must be between 0 and 65536"
    if not p.extra_topk:
        for key in ("extra_page_size", "extra_kv_format"):
            if getattr(p, key):
                yield "problem", key, f"{key} describes the second pool: set extra_topk too"
    if not 0 <= p.extra_page_size <= 256:
        yield "problem", "extra_page_size", \
            f"extra_page_size = {p.extra_page_size} must be between 1 and 256 (0: page_size)"
    if p.extra_kv_format and p.extra_kv_format not in FORMATS:
        yield "problem", "extra_kv_format", (f"extra_kv_format = {p.extra_kv_format!r} must be "
                                             f"one of {', '.join(FORMATS)}")


@rule
def attention_supported(s: Schedule, t: Target) -> Iterator[Violation]:
    kinds = backend(t.kind).attentions
    if s.problem.attention in ATTENTIONS and s.problem.attention not in kinds:
        yield "problem", "attention", (f"attention = {s.problem.attention!r}: target {t.kind} "
                                       f"has {', '.join(kinds)} kernels")


@rule
def kv_format_supported(s: Schedule, t: Target) -> Iterator[Violation]:
    readable = backend(t.kind).kv_formats
    if s.problem.kv in FORMATS and s.problem.kv not in readable:
        yield "problem", "kv_format", (f"kv_format = {s.problem.kv!r}: target {t.kind} "
                                       f"reads {', '.join(readable)} caches")


def rules_for(t: Target) -> list[Rule]:
    """The common rules, then the target's own."""
    return RULES + list(backend(t.kind).rules())


def violations(s: Schedule, t: Target) -> list[Violation]:
    out: list[Violation] = []
    for r in rules_for(t):
        out.extend(r(s, t))
    return out


def can_implement(s: Schedule, t: Target) -> ResourceReport:
    """What the schedule needs of its target (its backend counts), against what it has:
    ``report.ok``, ``report.needs`` (one Need per resource) and ``report.table()``."""
    return ResourceReport(backend(t.kind).resources(s, t))


def check(s: Schedule, loc: Located | None = None) -> Plan:
    """Raise ScheduleError for the first broken rule (then the resource check); return the
    checked plan: the schedule, the target it was checked against, its backend and the
    resources it needs."""
    loc = loc or Located(s.source, {})
    base = Path(s.source).resolve().parent if s.source else None
    if s.target.file is not None and not target_path(s.target.kind, s.target.file,
                                                     base).exists():
        raise loc.error("target", "file", (
            f"file = {clip(repr(s.target.file))}: no such target description (looked in "
            + ("the schedule's folder, " if base else "")
            + "the working directory, the repository and targets/)"))
    try:
        t = load_target(s.target.kind, s.target.file, base)
    except TargetError as e:
        raise loc.error("target", "file" if s.target.file else "kind", str(e)) from None
    # first broken rule only: later rules may assume what earlier ones checked (tp >= 1)
    for r in rules_for(t):
        for table, key, message in r(s, t):
            raise loc.error(table, key, message)
    report = can_implement(s, t)
    if not report.ok:
        raise loc.error("schedule", report.worst_key, report.message(), cls=ResourceError)
    return Plan(s, t, backend(t.kind), report)


_PLANS: dict[tuple, Plan] = {}
_LOCK = threading.Lock()


def plan_of(x: Union["Schedule", Plan]) -> Plan:
    """The plan of a schedule (checked once per process and working directory: a relative
    target file is found from there), or the plan itself."""
    if isinstance(x, Plan):
        return x
    key = (x, os.getcwd())
    with _LOCK:
        got = _PLANS.get(key)
    if got is None:
        got = check(x)
        with _LOCK:
            _PLANS[key] = got
    return got


def remember(p: Plan) -> Plan:
    """Keep a plan the checker made (e.g. while loading a file) for ``plan_of``."""
    with _LOCK:
        _PLANS[(p.schedule, os.getcwd())] = p
    return p
