"""choose_scheme: the argmin of the simulated times of each scheme's dry-run trace."""

from __future__ import annotations

import pytest
import torch

from mlagen.backends.sc11 import schemes
from mlagen.backends.sc11.costmodel import simulate
from mlagen.errors import EmulatorError, MlagenError
from mlagen.schedule.records import Schedule

from test_sc11_cost_synth import pipeline


class FakeInputs:
    def __init__(self, lens):
        self.cache_seqlens = torch.tensor(lens, dtype=torch.int32)
        self.s_q = 1


def traces():
    # four different workloads' traces, one per scheme, with different simulated times
    return {"heads": pipeline(cores=8, steps=6, buffers=1).array(),
            "batch": pipeline(cores=8, steps=3, buffers=2).array(),
            "seq": pipeline(cores=8, steps=5, buffers=2).array(),
            "batch_seq": pipeline(cores=8, steps=4, buffers=3).array()}


def test_choose_scheme_returns_the_argmin():
    schemes.clear_cache()
    tr = traces()
    calls = []

    def dry_run(s):
        calls.append(s)
        return tr[s]

    sched = Schedule.build(target="sc11")
    best, times = schemes.choose_scheme(sched, FakeInputs([5, 7]), dry_run)
    expect = {s: simulate(t).total_s for s, t in tr.items()}
    assert set(times) == set(schemes.SCHEMES)
    for s in times:
        assert times[s] == pytest.approx(expect[s])
    assert best == min(expect, key=expect.get) == "batch"
    assert sorted(calls) == sorted(schemes.SCHEMES)
    # remembered: the same lengths do not run the emulator again
    again, _ = schemes.choose_scheme(sched, FakeInputs([5, 7]), dry_run)
    assert again == best and len(calls) == 4
    # other lengths do
    tr["batch"], tr["seq"] = tr["seq"], tr["batch"]
    other, _ = schemes.choose_scheme(sched, FakeInputs([5, 8]), dry_run)
    assert other == "seq" and len(calls) == 8


def test_a_refused_scheme_is_skipped_and_all_refused_is_an_error():
    schemes.clear_cache()
    tr = traces()

    def dry_run(s):
        if s == "batch":
            raise EmulatorError("batch scheme needs batch >= cores")
        return tr[s]

    best, times = schemes.choose_scheme(Schedule.build(target="sc11"), FakeInputs([1]), dry_run)
    assert "batch" not in times and best in times
    assert best == min(times, key=times.get)

    def never(s):
        raise EmulatorError(f"{s} refused")

    with pytest.raises(MlagenError, match="no SC11 scheme"):
        schemes.choose_scheme(Schedule.build(target="sc11"), FakeInputs([2]), never)
