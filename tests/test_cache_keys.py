"""Builds are keyed by what the compiler sees: where a schedule came from (its name, its
file, its folder) changes nothing but the build's meta.json."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import mlagen
from mlagen.codegen import render
from mlagen.jit import cache_key, entries
from mlagen.schedule import Schedule, load

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("MLAGEN_CACHE_DIR", str(d))
    return d


def _copies(tmp_path: Path, example: str) -> list[Path]:
    """The example schedule, and copies of it under other names in other folders."""
    a, b = tmp_path / "a", tmp_path / "b" / "deeper"
    a.mkdir()
    b.mkdir(parents=True)
    src = ROOT / "schedules" / example
    shutil.copy(src, a / "first.toml")
    shutil.copy(src, b / "second_copy.toml")
    return [src, a / "first.toml", b / "second_copy.toml"]


def test_same_kernel_from_two_paths_is_one_cache_entry(tmp_path, cache, monkeypatch):
    paths = _copies(tmp_path, "sc11_attn.toml")
    monkeypatch.chdir(tmp_path)                 # relative and absolute paths alike
    scheds = [load(paths[1].relative_to(tmp_path)), load(paths[2])]
    assert scheds[0].name != scheds[1].name and scheds[0].source != scheds[1].source
    first = mlagen.build(scheds[0])
    second = mlagen.build(scheds[1])
    assert first.built and not second.built
    assert first.key == second.key
    assert [e.key for e in entries()] == [first.key]
    meta = json.loads((first.directory / "meta.json").read_text())
    assert meta["built_for"] == {"schedule": "first", "source": "a/first.toml"}


@pytest.mark.parametrize("example", ["sc11_fused_tp4.toml", "hopper_h200.toml"])
def test_sources_do_not_depend_on_where_the_schedule_came_from(tmp_path, example):
    keys = {cache_key(render(load(p))) for p in _copies(tmp_path, example)}
    s = load(ROOT / "schedules" / example)
    knobs = {f: getattr(r, f) for r in (s.problem, s.mapping) for f in r.__dataclass_fields__
             if getattr(r, f) is not None}
    keys.add(cache_key(render(Schedule.build(name="made_in_python", target=s.target.kind,
                                             **knobs))))
    assert len(keys) == 1


def test_hopper_shapes_with_the_same_knobs_share_one_build():
    """Heads, s_q and the page size are run-time arguments of the Hopper kernels: schedules
    that differ only there render the same sources and get one key."""
    knobs = dict(target="hopper", rows_per_tile=32, block_kv=32, buffers=2, warps=8)
    scheds = [Schedule.build(name="a", heads=128, tp=8, page_size=64, **knobs),
              Schedule.build(name="b", heads=16, page_size=32, max_s_q=2, **knobs),
              Schedule.build(name="c", heads=64, page_size=64, max_s_q=4, **knobs)]
    assert len({cache_key(render(s)) for s in scheds}) == 1
    other = Schedule.build(name="d", heads=16, page_size=32, **dict(knobs, buffers=3))
    assert cache_key(render(other)) != cache_key(render(scheds[0]))


def test_a_compile_time_change_changes_the_key():
    s = load(ROOT / "schedules" / "sc11_attn.toml")
    keys = {cache_key(render(s)), cache_key(render(s.replace(seq_tile=512))),
            cache_key(render(s.replace(max_s_q=1))), cache_key(render(s.replace(dtype="fp16")))}
    assert len(keys) == 4
    # a run-time knob (the multi-core scheme) is not compiled in
    assert cache_key(render(s.replace(scheme="seq"))) == cache_key(render(s))
