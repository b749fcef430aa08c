"""verify on a GPU target: examples in a worker process, poisoned outputs, and an illegal
memory access that fails its example without ending the session."""

import pytest
import torch

from mlagen.paths import SCHEDULES_DIR
from mlagen.schedule import load
from mlagen.schedule.records import Schedule
from mlagen.verify import verify
from mlagen.verify.strategies import Bounds

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]

SMALL = Bounds(max_batch=4, max_len=300, long_len=1100, max_extra_table=2)


def test_hopper_example_verifies_in_a_worker():
    r = verify(load(SCHEDULES_DIR / "hopper_h200.toml"), examples=40, progress=False,
               bounds=SMALL)
    assert r.ok, r.summary()
    assert r.examples_run >= 40      # and the path cases (strategies.path_cases) first
    assert r.poisoned           # outputs were NaN before every launch (runner's out=)


def test_small_hopper_schedule_passes():
    s = Schedule.build(name="h16", target="hopper", heads=16, max_s_q=2, rows_per_tile=32,
                       warps=4, block_kv=32)
    r = verify(s, examples=40, progress=False, bounds=SMALL)
    assert r.ok, r.summary()
    assert r.poisoned


def test_illegal_memory_access_fails_one_example_only():
    s = Schedule.build(name="h16", target="hopper", heads=16, max_s_q=2, rows_per_tile=32,
                       warps=4, block_kv=32)
    r = verify(s, examples=30, progress=False, bounds=SMALL, shrink_budget_s=120,
               runner_factory="verify_helpers:hopper_with_illegal_access_factory")
    assert not r.ok and r.failure.kind == "crash", r.summary()
    assert "illegal" in r.failure.message.lower()
    assert max(r.failure.case_fields["seqlens"]) > 100
    assert r.examples_run > 0           # examples before and after the crash ran
