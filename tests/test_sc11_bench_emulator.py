"""The benchmark's claims on the emulator's own traces (dry mode): the seed's point, auto's
choice, and that dry mode traces what compute mode does."""

from __future__ import annotations

import numpy as np
import pytest

from mlagen.backends import sc11
from mlagen.backends.sc11 import bench
from mlagen.backends.sc11.costmodel import simulate
from mlagen.problem import make_inputs


@pytest.fixture(scope="module")
def seed():
    return bench.seed_point()


def test_seed_point_reports_its_hardware_floor(seed):
    """No calibrated saving is asserted (tests/test_sc11_ranges.py tests the mechanism); the
    report puts each simulated segment beside its floor, and no run beats its floor."""
    assert seed.saving > 0.0
    assert seed.floor <= seed.double <= seed.single
    assert "simulated / floor" in seed.text() and "hardware floor" in seed.text()


def test_seed_point_double_buffered_is_near_the_pipelined_bound(seed):
    assert seed.within_bound <= 0.15, seed.text()
    assert seed.pipelined <= seed.double * 1.02     # an ideal: (almost) never beaten


def test_seed_point_auto_picks_the_best(seed):
    assert seed.point.auto_excess(2) <= 0.05
    assert seed.point.auto[2] == seed.scheme


def test_small_grid_auto_within_5_percent():
    g = bench.bench_grid(batches=(1, 16), seqlens=(128, 4096))
    assert g.auto_ok()
    for p in g.points:
        assert p.saving() >= -0.01                   # double buffering never costs time
    by = {(p.batch, p.seqlen): p for p in g.points}
    # one long sequence: splitting it over the cores beats one core doing it all
    assert by[(1, 4096)].times[2]["seq"] < 0.8 * by[(1, 4096)].times[2]["batch"]
    # heads reads the KV once per core: never the best with many long sequences
    assert by[(16, 4096)].best(2)[0] != "heads"


def test_dry_mode_traces_what_compute_mode_does():
    sched = bench._schedule(None)
    inp = make_inputs(sched.problem, 4, [300, 17, 1100, 64], heads=sched.heads_per_device,
                      seed=3)
    run = sc11.runner(sched)
    for scheme in ("batch", "seq"):
        real = run(inp, scheme=scheme).extra["trace"]
        dry = run.dry_run(inp, scheme)
        assert np.array_equal(real, dry)
        assert simulate(real).total_s == simulate(dry).total_s


def test_runner_auto_runs_the_fastest_scheme():
    from mlagen.backends.sc11.schemes import SCHEMES, choose_scheme, clear_cache
    sched = bench._schedule(None)              # scheme = "auto"
    assert sched.mapping.scheme == "auto"
    inp = make_inputs(sched.problem, 2, [1500, 40], heads=sched.heads_per_device, seed=5)
    run = sc11.runner(sched)
    clear_cache()
    out = run(inp)
    assert out.extra["scheme"] in SCHEMES
    best, times = choose_scheme(sched, inp, lambda s: run.dry_run(inp, s))
    assert out.extra["scheme"] == best == min(times, key=times.get)
    assert simulate(out.extra["trace"]).total_s == times[best]
