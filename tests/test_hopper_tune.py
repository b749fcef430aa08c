"""`mlagen tune --target hopper` without a GPU: the search space is legal, a run writes the
table keyed by GPU and version, an interrupted run resumes, and the API's per-shape defaults
read the table (by batch as well as rows)."""

from __future__ import annotations

import json

import pytest

from mlagen.backends.hopper import defaults, tune, tuned
from mlagen.errors import MlagenError
from mlagen.schedule.rules import check

SHAPES = [tune.Shape(128, 1, 4096, 16, False), tune.Shape(128, 1, 8192, 16, False),
          tune.Shape(8, 1, 8192, 16, True)]


def fake_measure(calls):
    """Times that prefer 16-row tiles at b=128 and 32-row tiles at b=8."""
    def m(shape, k):
        calls.append((shape.label(), tune.cand_id(k)))
        want = 16 if shape.b == 128 else 32
        return 1.0 + abs(k["rows_per_tile"] - want) / 16 + k["buffers"] / 100 + shape.sk / 1e5
    return m


@pytest.fixture
def table(tmp_path, monkeypatch):
    path = tmp_path / "t.json"
    monkeypatch.setenv("MLAGEN_HOPPER_TUNE_TABLE", str(path))
    tuned.forget_tables()
    yield path
    tuned.forget_tables()


def test_candidates_are_legal_and_distinct():
    for space in ("small", "full"):
        cands = tune.candidates(space)
        assert len({tune.cand_id(k) for k in cands}) == len(cands) >= 8
        assert {k["rows_per_tile"] for k in cands} == {16, 32, 64}
        for k in cands[:20]:
            check(tune.schedule_of(k))
    assert len(tune.candidates("full")) > len(tune.candidates("small"))


def test_default_shapes_are_the_bench_rows():
    shapes = tune.default_shapes()
    assert 51 <= len(shapes) <= 59 and tune.Shape(1, 1, 32768, 128, False) in shapes


def test_tune_writes_the_table_and_resumes(table):
    calls = []
    mine = tune.tune(SHAPES, gpu="FakeGPU", measure=fake_measure(calls), build=False,
                     progress=False)
    n = len(tune.candidates("small"))
    # every pair once, then b=8's pick (32-row tiles, not the default) and the default in turn
    assert len(calls) == 3 * n + 2 * tune.CONFIRM_ROUNDS
    assert mine["entries"]["b=8,rows=16"]["confirm"]["speedup"] > 1
    data = json.loads(table.read_text())
    assert tune.table_key("FakeGPU") in data["tables"]
    assert mine["entries"]["b=128,rows=16"]["knobs"]["rows_per_tile"] == 16
    assert mine["entries"]["b=8,rows=16"]["knobs"]["rows_per_tile"] == 32
    # both b=128 shapes share one key: one choice for both, each shape's time recorded
    assert len(mine["entries"]["b=128,rows=16"]["shapes"]) == 2
    calls.clear()
    tune.tune(SHAPES, gpu="FakeGPU", measure=fake_measure(calls), build=False, progress=False)
    assert calls == []                                   # everything was in the log
    # a cut log line (an interrupted write) is skipped, that one pair measured again
    log = tune.log_path(table)
    lines = log.read_text().splitlines()
    log.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:10] + "\n")
    tune.tune(SHAPES, gpu="FakeGPU", measure=fake_measure(calls), build=False, progress=False)
    assert len(calls) == 1


def test_defaults_read_the_table_by_batch(table):
    tune.tune(SHAPES, gpu="FakeGPU", measure=fake_measure([]), build=False, progress=False)
    tuned.forget_tables()
    s128 = defaults.default_schedule(16, "bf16", 128, "FakeGPU")
    s8 = defaults.default_schedule(16, "bf16", 8, "FakeGPU")
    s12 = defaults.default_schedule(16, "bf16", 12, "FakeGPU")      # nearest measured: 8
    assert (s128.mapping.rows_per_tile, s8.mapping.rows_per_tile) == (16, 32)
    assert s12.mapping.rows_per_tile == 32
    # not measured near this batch, another GPU, or another version: the static defaults
    static = defaults.default_schedule(16, "bf16")
    for s in (defaults.default_schedule(16, "bf16", 40, "FakeGPU"),
              defaults.default_schedule(16, "bf16", 128, "OtherGPU")):
        assert s == static
    assert tuned.tuned_knobs("FakeGPU", 128, 16) is not None
    assert tune.table_key("FakeGPU", "0.0.0") not in json.loads(table.read_text())["tables"]


def test_a_broken_table_is_an_error_for_tune(table):
    table.write_text("{not json")
    with pytest.raises(MlagenError, match="not a tuning table"):
        tune.tune(SHAPES[:1], gpu="FakeGPU", measure=lambda s, k: 1.0, build=False,
                  progress=False)


def test_failed_measurements_are_never_chosen(table):
    def m(shape, k):
        if k["rows_per_tile"] == 16:
            raise RuntimeError("launch failed")
        return 2.0 - k["rows_per_tile"] / 100
    mine = tune.tune(SHAPES[:1], gpu="FakeGPU", measure=m, build=False, progress=False)
    assert mine["entries"]["b=128,rows=16"]["knobs"]["rows_per_tile"] == 64


def test_build_all_imports_the_builder():
    assert tune.build_all([], jobs=1) == {}


def test_the_search_covers_the_main_loop_and_a_tuned_wgmma_entry_is_used(table):
    """The space holds wgmma candidates (with their split costs); a table that picks wgmma
    for a key makes the defaults use it, except where the page size rules wgmma out."""
    cands = tune.candidates("small")
    loops = {k["mainloop"] for k in cands}
    assert loops == {"mma_sync", "wgmma"}
    assert len({k["split_cost"] for k in cands if k["mainloop"] == "wgmma"}) >= 2
    assert all(tune.cand_id(k).endswith("_wgmma") == (k["mainloop"] == "wgmma") for k in cands)

    def m(shape, k):   # wgmma with split cost 8 is fastest
        return 1.0 if (k["mainloop"], k["split_cost"]) == ("wgmma", 8) else 2.0
    mine = tune.tune(SHAPES[:1], gpu="FakeGPU", measure=m, build=False, progress=False)
    assert mine["entries"]["b=128,rows=16"]["knobs"]["mainloop"] == "wgmma"
    tuned.forget_tables()
    s = defaults.default_schedule(16, "bf16", 128, "FakeGPU")
    assert (s.mapping.mainloop, s.mapping.split_cost) == ("wgmma", 8)
    # pages of 16 cannot take wgmma: the static defaults for that page size
    s16 = defaults.default_schedule(16, "bf16", 128, "FakeGPU", page_size=16)
    assert s16 == defaults.default_schedule(16, "bf16", page_size=16)
    assert s16.mapping.mainloop == "mma_sync"


def test_the_search_covers_the_few_rows_consumer_warpgroups(table):
    """The few-rows wgmma kernel is searched with one and two consumer warpgroups (warps 4
    and 8) for both of its row counts; a table that picks two makes the defaults use them."""
    few = {(k["rows_per_tile"], k["warps"]) for k in tune.candidates("small")
           if k["mainloop"] == "wgmma" and k["rows_per_tile"] < 64}
    assert few == {(16, 4), (16, 8), (32, 4), (32, 8)}
    assert {(k["rows_per_tile"], k["warps"]) for k in tune.candidates("defaults")
            if k["mainloop"] == "wgmma"} == {(r, w) for r, _, _, w in
                                             set(defaults.WGMMA_KNOBS.values())}

    def m(shape, k):   # two consumer warpgroups on 16 rows are fastest
        return 1.0 if (k["mainloop"], k["rows_per_tile"], k["warps"]) == ("wgmma", 16, 8) \
            else 2.0
    mine = tune.tune(SHAPES[:1], gpu="FakeGPU", measure=m, build=False, progress=False)
    assert mine["entries"]["b=128,rows=16"]["knobs"]["warps"] == 8
    tuned.forget_tables()
    s = defaults.default_schedule(16, "bf16", 128, "FakeGPU")
    assert (s.mapping.mainloop, s.mapping.rows_per_tile, s.mapping.warps) == ("wgmma", 16, 8)


def test_the_wgmma_space_and_the_margin_that_keeps_the_default(table):
    """space "wgmma": the wgmma kernels alone with a wider split policy.  A candidate within
    MARGIN of the static default does not replace it (one median's noise would churn the
    table); one faster by more does."""
    cands = tune.candidates("wgmma")
    assert {k["mainloop"] for k in cands} == {"wgmma"}
    assert {k["split_cost"] for k in cands} == {2, 3, 5, 8, 12}
    default = tune.static_default_id(128)
    assert default in {tune.cand_id(k) for k in cands}

    def m(gain):
        def f(shape, k):   # split cost 12 faster than the default by `gain`
            return 1.0 / (1 + gain) if k["split_cost"] == 12 else 1.0 + k["split_cost"] / 1e3
        return f
    shape = [tune.Shape(32, 1, 1024, 128, False)]
    mine = tune.tune(shape, space="wgmma", gpu="FakeGPU", measure=m(tune.MARGIN / 2),
                     build=False, progress=False)
    e = mine["entries"]["b=32,rows=128"]
    assert e["candidate"] == e["default"] == default
    table.unlink()
    tune.log_path(table).unlink()
    mine = tune.tune(shape, space="wgmma", gpu="FakeGPU", measure=m(tune.MARGIN * 3),
                     build=False, progress=False)
    assert mine["entries"]["b=32,rows=128"]["knobs"]["split_cost"] == 12


def test_a_pick_that_does_not_hold_when_timed_again_gives_way_to_the_default(table):
    """The search times each (shape, candidate) once.  A pick that beat the default there
    is timed again in turn with it (confirm): a one-off fast sample (noise) gives the entry
    back to the default; a real gain keeps the pick.  Both record the confirmation."""
    default = tune.static_default_id(128)
    shape = [tune.Shape(32, 1, 1024, 128, False)]

    def m(lasting):
        seen = {}

        def f(s, k):   # split cost 12 is 10 % faster: always, or only the first time
            n = seen[tune.cand_id(k)] = seen.get(tune.cand_id(k), 0) + 1
            fast = k["split_cost"] == 12 and (lasting or n == 1)
            return 0.9 if fast else 1.0 + k["split_cost"] / 1e3
        return f
    mine = tune.tune(shape, space="wgmma", gpu="FakeGPU", measure=m(False), build=False,
                     progress=False)
    e = mine["entries"]["b=32,rows=128"]
    assert e["candidate"] == e["default"] == default
    assert e["confirm"]["rounds"] == tune.CONFIRM_ROUNDS and e["confirm"]["speedup"] < 1
    assert tuned.tuned_knobs("FakeGPU", 32, 128)["split_cost"] == 5
    table.unlink()
    tune.log_path(table).unlink()
    tuned.forget_tables()
    mine = tune.tune(shape, space="wgmma", gpu="FakeGPU", measure=m(True), build=False,
                     progress=False)
    e = mine["entries"]["b=32,rows=128"]
    assert e["knobs"]["split_cost"] == 12 and e["confirm"]["speedup"] > 1.1


def test_the_shipped_table_is_read_for_its_gpu_and_holds_legal_confirmed_picks(tmp_path,
                                                                              monkeypatch):
    """mlagen/backends/hopper/tuned.json (`mlagen tune --space wgmma` on the H200): keyed by
    this version, every pick a legal candidate of the search space, every pick that is not
    the static default confirmed by more than MARGIN, and the API's defaults read it."""
    monkeypatch.setenv("MLAGEN_HOPPER_TUNE_TABLE", str(tmp_path / "none.json"))
    tuned.forget_tables()
    data = json.loads(tuned.SHIPPED_TABLE.read_text())
    (key, mine), = data["tables"].items()
    gpu = mine["gpu"]
    assert key == tuned.table_key(gpu)
    ids = {tune.cand_id(k) for k in tune.candidates(mine["space"])}
    moved = 0
    for skey, e in mine["entries"].items():
        assert e["candidate"] in ids and tune.cand_id(e["knobs"]) == e["candidate"]
        if e["candidate"] != e["default"]:
            moved += 1
            assert e["confirm"]["speedup"] > 1 + tune.MARGIN
        b, rows = (int(x.split("=")[1]) for x in skey.split(","))
        assert tuned.tuned_knobs(gpu, b, rows) == e["knobs"]
        s = defaults.default_schedule(rows, "bf16", b, gpu)
        assert s.mapping.split_cost == e["knobs"]["split_cost"]
    assert moved >= 1
    tuned.forget_tables()


def test_a_tuned_entry_the_rules_refuse_is_named_not_ignored(table):
    """A hand-edited table entry that breaks a rule (split_cost = 0) is refused with the
    table's path, the entry's key and the rule, not silently replaced by the defaults."""
    from mlagen.errors import ScheduleError

    knobs = dict(rows_per_tile=64, block_kv=64, buffers=2, warps=8, split_cost=0,
                 mainloop="wgmma")
    table.write_text(json.dumps({"format": 1, "tables": {tuned.table_key("FakeGPU"): {
        "entries": {"b=32,rows=128": {"knobs": knobs}}}}}))
    tuned.forget_tables()
    with pytest.raises(ScheduleError) as info:
        defaults.default_schedule(128, "bf16", 32, "FakeGPU")
    msg = str(info.value)
    assert msg.startswith(f"{table}: tuned entry 'b=32,rows=128' for FakeGPU: ")
    assert "split_cost = 0 must be 1..64" in msg and "\n" not in msg
    knobs["split_cost"] = 2                       # the same entry, legal: used
    table.write_text(json.dumps({"format": 1, "tables": {tuned.table_key("FakeGPU"): {
        "entries": {"b=32,rows=128": {"knobs": knobs}}}}}))
    tuned.forget_tables()
    assert defaults.default_schedule(128, "bf16", 32, "FakeGPU").mapping.split_cost == 2
