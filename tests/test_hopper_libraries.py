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
