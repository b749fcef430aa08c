"""Repro files: a failing example saved so that one command replays it exactly.

A repro file (torch.save) holds the schedule as TOML text (plus its planted fault, which
files cannot express), the input tensors exactly as the kernel got them (strides too: a
strided q stays strided), how they were drawn, the failure message and, for a mismatch,
the kernel's outputs (out, lse): a failure on a GPU machine can be studied on any other.
`mlagen verify --repro FILE` rebuilds the schedule, reruns the kernel on those tensors and
compares again.
"""

from __future__ import annotations

import dataclasses
import re
import time
from pathlib import Path
from typing import Any, Optional

import torch

from ..errors import InputError
from ..paths import cache_dir
from ..problem import FusedWeights, MlaInputs, MlaOutputs, SparseInputs, SparsePool
from ..rope import RopeConfig, RotaryTable
from ..schedule.parse import dumps, loads
from ..schedule.records import Schedule

FORMAT = "mlagen-verify-repro/1"


def failures_dir() -> Path:
    return cache_dir() / "verify" / "failures"


def _tensors(inputs: MlaInputs | SparseInputs) -> dict[str, Any]:
    w = inputs.weights
    weights = None if w is None else dict(w_uq=w.w_uq, w_uk=w.w_uk, w_uv=w.w_uv,
                                          rope_theta=w.rope_theta, rope=_rope_record(w.rope))
    if isinstance(inputs, SparseInputs):
        return dict(sparse=True, q=inputs.q, softmax_scale=inputs.softmax_scale,
                    attn_sink=inputs.attn_sink, dv=inputs.dv, meta=dict(inputs.meta),
                    pools=[dict(k_cache=p.k_cache, indices=p.indices,
                                topk_length=p.topk_length, kv_format=p.kv_format,
                                k_descale=p.k_descale) for p in inputs.pools],
                    q_lora=inputs.q_lora, weights=weights, cache_seqlens=inputs.cache_seqlens)
    return dict(q=inputs.q, k_cache=inputs.k_cache, block_table=inputs.block_table,
                cache_seqlens=inputs.cache_seqlens, softmax_scale=inputs.softmax_scale,
                causal=inputs.causal, q_lora=inputs.q_lora, weights=weights,
                meta=dict(inputs.meta), kv_format=inputs.kv_format, k_descale=inputs.k_descale)


def _rope_record(rope) -> Optional[dict]:
    if rope is None:
        return None
    if isinstance(rope, RotaryTable):
        return dict(table=True, cos=rope.cos, sin=rope.sin, layout=rope.layout)
    return dict(table=False, **dataclasses.asdict(rope))


def _rope_from(rec: Optional[dict]):
    if rec is None:
        return None
    rec = dict(rec)
    if rec.pop("table"):
        return RotaryTable(**rec)
    return RopeConfig(**rec)


def _inputs(d: dict[str, Any]) -> MlaInputs | SparseInputs:
    w = d.get("weights")
    if w is not None:
        w = dict(w, rope=_rope_from(w.get("rope")))
    if d.get("sparse"):
        return SparseInputs(q=d["q"], pools=[SparsePool(**p) for p in d["pools"]],
                            softmax_scale=d["softmax_scale"], attn_sink=d.get("attn_sink"),
                            dv=d["dv"], meta=d.get("meta", {}), q_lora=d.get("q_lora"),
                            weights=None if w is None else FusedWeights(**w),
                            cache_seqlens=d.get("cache_seqlens"))
    return MlaInputs(q=d["q"], k_cache=d["k_cache"], block_table=d["block_table"],
                     cache_seqlens=d["cache_seqlens"], softmax_scale=d["softmax_scale"],
                     causal=d["causal"], q_lora=d.get("q_lora"),
                     weights=None if w is None else FusedWeights(**w), meta=d.get("meta", {}),
                     kv_format=d.get("kv_format", ""), k_descale=d.get("k_descale"))


def save(schedule: Schedule, inputs: MlaInputs, message: str, case: Optional[dict] = None,
         directory: Optional[Path] = None, actual: Optional[MlaOutputs] = None) -> Path:
    """Write a repro file under <cache>/verify/failures/ and return its path.  actual: the
    kernel's outputs on these inputs (a mismatch), kept on the CPU."""
    directory = Path(directory) if directory else failures_dir()
    directory.mkdir(parents=True, exist_ok=True)
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", f"{schedule.name}-{schedule.variant_name()}")
    path = directory / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}-{time.time_ns() % 10**6}.pt"
    torch.save(dict(format=FORMAT, schedule_toml=dumps(schedule), schedule_name=schedule.name,
                    schedule_source=schedule.source, fault=schedule.fault,
                    inputs=_tensors(inputs.to("cpu")), case=case or {}, message=message,
                    actual=None if actual is None else
                    {k: None if getattr(actual, k) is None else getattr(actual, k).detach().cpu()
                     for k in ("out", "lse")}),
               path)
    return path


@dataclasses.dataclass
class Repro:
    schedule: Schedule
    inputs: MlaInputs
    message: str
    case: dict
    path: Path
    actual: Optional[MlaOutputs] = None   # the kernel's outputs where the failure had them


def load(path: str | Path) -> Repro:
    path = Path(path)
    if path.is_dir():
        raise InputError(f"{path}: cannot read repro file: is a directory")
    try:
        data = torch.load(path, weights_only=True)   # plain records and tensors: no pickled code
    except OSError as e:
        raise InputError(f"{path}: cannot read repro file: {e.strerror or e}") from None
    except Exception as e:   # a file that is not one: unpickling fails in many ways
        raise InputError(f"{path}: not an mlagen verify repro file "
                         f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
                         ) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise InputError(f"{path}: not an mlagen verify repro file (format {FORMAT})")
    schedule = loads(data["schedule_toml"], source=data.get("schedule_source"),
                     name=data.get("schedule_name", path.stem))
    if data.get("fault", "none") != "none":
        schedule = schedule.with_fault(data["fault"])
    got = data.get("actual")
    return Repro(schedule, _inputs(data["inputs"]), data.get("message", ""),
                 data.get("case", {}), path,
                 None if not isinstance(got, dict) else MlaOutputs(got.get("out"), got.get("lse")))
