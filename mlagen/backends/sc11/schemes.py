"""Choosing phase B's multi-core scheme per workload from the cost model.

The latent KV has no head axis, so the 8 cores of a chip split phase B by heads, batch,
sequence or batch x sequence (docs/sc11.md).  Which is fastest depends on the batch and the
lengths; ``choose_scheme`` asks the emulator for each scheme's trace in dry mode (the same
control flow and trace, no data moved) and simulates them: the fastest is "auto"'s pick.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from ...errors import MlagenError
from ...schedule.records import Schedule
from .. import load_target
from .costmodel import Machine, simulate
from .knobs import SCHEMES as ALL_SCHEMES

SCHEMES = tuple(s for s in ALL_SCHEMES if s != "auto")     # heads, batch, seq, batch_seq

_CACHE: "OrderedDict[tuple, tuple]" = OrderedDict()
_CACHE_SIZE = 256


def machine_for(schedule: Schedule) -> Machine:
    base = Path(schedule.source).parent if schedule.source else None
    return Machine.from_target(load_target(schedule.target.kind, schedule.target.file, base))


def _key(schedule: Schedule, inputs) -> Optional[tuple]:
    """Lengths, batch and s_q decide the traces of one variant (the data do not)."""
    try:
        lens = inputs.cache_seqlens.detach().cpu().numpy().astype(np.int64)
        return (schedule.variant_name(), schedule.target.file, inputs.s_q, lens.tobytes())
    except AttributeError:
        return None


def scheme_times(schedule: Schedule, dry_run: Callable, schemes=SCHEMES,
                 machine: Optional[Machine] = None) -> tuple:
    """({scheme: simulated seconds}, {scheme: why it could not run}) over `schemes`."""
    mc = machine or machine_for(schedule)
    times, why = {}, {}
    for s in schemes:
        try:
            trace = dry_run(s)
        except MlagenError as e:          # a scheme the emulator refuses for this workload
            why[s] = str(e)
            continue
        times[s] = simulate(trace, mc).total_s
    return times, why


def choose_scheme(schedule: Schedule, inputs, dry_run: Callable[[str], np.ndarray],
                  schemes=SCHEMES) -> tuple:
    """(the fastest scheme, {scheme: simulated seconds}).

    dry_run(scheme) -> the trace of `inputs` under that scheme (EVENT_DTYPE array).  Ties go
    to the earlier scheme in SCHEMES.  Results are remembered per (variant, s_q, lengths),
    since the traces depend on nothing else.
    """
    key = _key(schedule, inputs)
    if key is not None and key in _CACHE:
        _CACHE.move_to_end(key)
        best, times = _CACHE[key]
        return best, dict(times)
    times, why = scheme_times(schedule, dry_run, schemes)
    if not times:
        raise MlagenError("no SC11 scheme can run this workload: " +
                          "; ".join(f"{s}: {w}" for s, w in why.items()))
    best = min(times, key=lambda s: (times[s], schemes.index(s)))
    if key is not None:
        _CACHE[key] = (best, dict(times))
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return best, times


def clear_cache() -> None:
    _CACHE.clear()
