"""Which Hopper kernel libraries a call loads, without a GPU (the build and the device
queries replaced by stand-ins that record what was asked for)."""

from __future__ import annotations

import pytest
import torch

from mlagen.backends.hopper import api, ops
from mlagen.schedule.records import Schedule


class _Lib:
    def ctas_per_sm(self) -> int:
        return 1

    def cluster_parts(self, parts: int) -> int:
        return parts


@pytest.fixture()
def asked(monkeypatch):
    keys: list[str] = []

    def library(plan):
        keys.append(plan.variant)
        return plan.variant

    monkeypatch.setattr(ops, "library", library)
    monkeypatch.setattr(ops, "get", lambda key: _Lib())
    monkeypatch.setattr(ops, "sm_count", lambda device: 132)
    api._resolve.cache_clear()
    yield keys
    api._resolve.cache_clear()


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_metadata_and_decode_of_a_schedule_use_one_library(asked, dtype):
    s = Schedule.build(target="hopper", heads=16, page_size=64, dtype=dtype)
    seqlens = torch.tensor([100, 5000], dtype=torch.int32)
    _, _, md_key, _ = api._metadata_plan(seqlens, 16, s)
    decode_key = api._library_key(16, dtype, s)
    assert md_key == decode_key and dtype in decode_key
    assert set(asked) == {decode_key}


def test_the_miss_path_runs_defaults_then_plan_then_library(monkeypatch):
    """api._resolve, the miss path of a call signature, asks each module once, in order:
    the schedule (defaults.resolve), its checked plan, its library."""
    import sys

    calls = []
    real_resolve = api.defaults.resolve
    real_plan_of = api.plan_of

    def resolve(*a):
        calls.append("defaults")
        return real_resolve(*a)

    def plan_of(s):
        calls.append("plan")
        return real_plan_of(s)

    def library(plan):
        calls.append("library")
        return plan.variant

    monkeypatch.setattr(api.defaults, "resolve", resolve)
    monkeypatch.setattr(api, "plan_of", plan_of)
    monkeypatch.setattr(ops, "library", library)
    api._resolve.cache_clear()
    try:
        key, rows, splits, cost = api._resolve(16, "bf16", None, 8, "NoSuchGPU", 64)
    finally:
        api._resolve.cache_clear()
    assert calls == ["defaults", "plan", "library"]
    assert "bf16" in key and rows in (16, 32, 64) and splits == 0 and cost >= 0
    # and the modules after it never reach back: the library and launch module knows
    # nothing of the defaults or the calls above it
    for mod in ("mlagen.backends.hopper.ops", "mlagen.backends.hopper.defaults"):
        src = sys.modules[mod].__file__
        text = open(src).read()
        for above in ("api", "defaults" if mod.endswith("ops") else "ops"):
            assert f"from .{above} import" not in text and f"from . import {above}" not in text \
                and f"hopper.{above} import" not in text, (mod, above)
