"""The mutation harness (mlagen.verify.mutants): one-line source mutations of the kernels,
planted through a patched copy of the sources (mlagen.jit.patches), each of which the real
`verify` must catch on the example schedules.  On the CPU: every mutant applies exactly
once and is distinct; a stale patch is an error; the patch reaches the ordinary build; the
SC11 escape-class mutants are caught by `mlagen verify --profile smoke` on sc11_attn and
the unmutated example passes it.  Marked slow: every SC11 mutant compiles and is caught
(the figures in BENCHMARKS.md); nvcc: every Hopper mutant compiles; cuda: the Hopper
escape-class mutants are caught on the H200."""

from __future__ import annotations

import collections
import dataclasses
import io
import json
import shutil
from pathlib import Path

import pytest
import torch

from mlagen.backends import all_backends
from mlagen.codegen import render
from mlagen.jit import cache_key
from mlagen.jit import patches
from mlagen.paths import SCHEDULES_DIR, TEMPLATES_DIR
from mlagen.schedule import load
from mlagen.verify import mutants as harness
from mlagen.verify.mutation import Mutant, planted

ALL = harness.all_mutants()


def example(name):
    return load(SCHEDULES_DIR / f"{name}.toml")


def by_name(name) -> Mutant:
    return next(m for m in ALL if m.name == name)


@pytest.mark.parametrize("m", ALL, ids=lambda m: f"{m.target}-{m.name}")
def test_every_mutant_applies_exactly_once_to_each_schedule_it_names(m):
    assert m.schedules
    for name in m.schedules:
        s = example(name)
        assert s.target.kind == m.target
        src = harness.render_patched(m, s)          # raises unless exactly once
        assert src.include_dirs != render(s).include_dirs or src.files != render(s).files


def test_mutants_are_distinct_from_each_other_and_from_the_fault_switches():
    assert len({m.name for m in ALL}) == len(ALL)
    edits = collections.Counter((m.file, m.old) for m in ALL)
    assert all(n == 1 for n in edits.values()), edits
    for m in ALL:
        assert m.old != m.new
        # the edited stretch (between the common prefix and suffix) is no fault switch
        a, b = m.old, m.new
        i = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
        j = 0
        while j < min(len(a), len(b)) - i and a[-1 - j] == b[-1 - j]:
            j += 1
        assert "FAULT" not in (a[i:len(a) - j] + b[i:len(b) - j]).upper(), m.name
        assert "\n" not in m.old and "\n" not in m.new, "one line each"
    # every backend with kernels has its list, each escape class of the issue is there
    kinds = {m.target for m in ALL}
    assert kinds == {b.kind for b in all_backends()}
    escapes = {m.escape for m in ALL if m.escape}
    assert len(escapes) >= 6, escapes


def test_a_patch_whose_text_is_missing_is_an_error():
    s = example("sc11_attn")
    stale = patches.Patch("mla.h", "this line is not in the kernel", "x")
    with pytest.raises(patches.PatchError, match="occurs 0 times"):
        patches.apply(render(s), [stale])
    twice = patches.Patch("mla.h", "for (", "for (", count=1)
    with pytest.raises(patches.PatchError, match="expected 1"):
        patches.apply(render(s), [twice])


def test_a_patch_for_another_targets_file_leaves_the_sources_alone():
    s = example("sc11_attn")
    src = render(s)
    assert patches.apply(src, [by_name("wgmma_page_offset").patch()]) is src


def test_the_patched_copy_has_its_own_cache_key_and_the_templates_stay_as_they_are():
    s = example("sc11_attn")
    m = by_name("sum_not_rescaled")
    header = TEMPLATES_DIR / "sc11" / "runtime" / "mla.h"
    before = header.read_text()
    plain = render(s)
    patched = patches.apply(plain, [m.patch()])
    assert cache_key(patched) != cache_key(plain)
    text = (patched.include_dirs[0] + "/mla.h")
    assert m.new in open(text).read() and m.old not in open(text).read()
    assert header.read_text() == before and m.old in before


def test_the_environment_variable_reaches_every_build():
    s = example("sc11_attn")
    m = by_name("tile_last_exclusive")
    plain_key = cache_key(patches.apply(render(s)))
    with planted(m) as path:
        assert json.loads(path.read_text())[0]["old"] == m.old
        assert cache_key(patches.apply(render(s))) == cache_key(
            patches.apply(render(s), [m.patch()]))
    assert cache_key(patches.apply(render(s))) == plain_key     # unset again after


def test_cli_lists_and_refuses_bad_usage(capsys):
    assert harness.main(["--list"]) == 0
    out = capsys.readouterr().out
    assert "sum_not_rescaled" in out and "wgmma_bad_page_last" in out
    assert harness.main([]) == 2
    assert harness.main(["--target", "sc11", "--only", "no_such_mutant"]) == 2
    err = capsys.readouterr().err
    assert "no sc11 mutant named no_such_mutant" in err


def _fake_runs(monkeypatch, baseline_fails):
    """run_one stood in: the unmutated run fails (or passes) its check, every mutant run
    fails it; the calls are recorded."""
    calls = []

    def fake(m, n, prof, examples=None, time_budget_s=None):
        calls.append(m.name)
        failed = baseline_fails if m.name == harness.UNMUTATED else True
        return harness.Outcome(m.name, n, prof, failed,
                               "crash: ExampleCrashed: the kernel raised" if failed else "")
    monkeypatch.setattr(harness, "run_one", fake)
    return calls


@pytest.mark.parametrize("baseline_fails", [True, False])
def test_a_check_that_fails_unmutated_counts_no_catch(monkeypatch, baseline_fails):
    """A schedule whose verify fails with nothing planted (a crash at example 0) would
    "catch" every mutant: the harness runs the baseline first and does not count those."""
    calls = _fake_runs(monkeypatch, baseline_fails)
    name = harness.mutants_for("sc11")[0].name
    rep = harness.run("sc11", ["smoke"], only=[name], first_schedule=True, isolate=False)
    assert calls == [harness.UNMUTATED, name]
    assert [b.caught for b in rep.baselines] == [baseline_fails]
    (o,) = rep.outcomes
    if baseline_fails:
        assert not o.caught and o.error.startswith("not counted: the unmutated schedule fails")
        assert rep.per_mutant() == {} and not rep.ok()
        assert "FAILS unmutated" in rep.summary()
    else:
        assert o.caught and not o.error and rep.per_mutant() == {name: True} and rep.ok()
    assert json.loads(json.dumps(rep.to_json()))["baselines"][0]["mutant"] == harness.UNMUTATED


def test_shards_split_the_list_by_schedule_and_together_run_all_of_it(monkeypatch):
    """--shard K/N: N calls that each fit a device visit run every (mutant, schedule) pair
    once, each schedule (and so its baseline) in one shard only."""
    _fake_runs(monkeypatch, False)
    whole = harness.run("sc11", ["smoke"], isolate=False)
    runs = {(o.mutant, o.schedule) for o in whole.outcomes}
    parts = [harness.run("sc11", ["smoke"], isolate=False, shard=(k, 3)) for k in range(3)]
    got = [(o.mutant, o.schedule) for r in parts for o in r.outcomes]
    assert sorted(got) == sorted(runs) and len(got) == len(runs)
    owners = [{o.schedule for o in r.outcomes} for r in parts]
    assert all(not (a & b) for i, a in enumerate(owners) for b in owners[i + 1:])
    assert [{b.schedule for b in r.baselines} for r in parts] == owners


def test_a_resumed_run_keeps_what_finished_and_runs_the_rest(monkeypatch, tmp_path):
    """--resume REPORT: a call cut short by its wall limit is continued by the next; the
    finished runs and passing baselines are carried, the rest (not reached, or under a
    failing baseline) run, and the two calls' report is the whole list's."""
    calls = _fake_runs(monkeypatch, False)
    ms = [m.name for m in harness.mutants_for("sc11")[:3]]
    first = harness.run("sc11", ["smoke"], only=ms, first_schedule=True, isolate=False)
    first.outcomes[2] = dataclasses.replace(first.outcomes[2], caught=False,
                                           error="not reached: the harness's wall limit")
    path = tmp_path / "first.json"
    path.write_text(json.dumps(first.to_json()))
    calls.clear()
    rep = harness.run("sc11", ["smoke"], only=ms, first_schedule=True, isolate=False,
                      resume=[harness.load_report(str(path), "sc11")])
    assert calls == [ms[2]]                          # no baseline again, no finished run
    assert sorted(o.mutant for o in rep.outcomes) == sorted(ms) and rep.ok()
    assert [b.caught for b in rep.baselines] == [False] * len(first.baselines)


def test_a_report_of_other_sources_or_target_is_refused(tmp_path, capsys):
    rep = harness.Report("sc11", [harness.Outcome("x", "sc11_attn", "smoke", True)])
    d = rep.to_json()
    for change, why in [({"sources": "0" * 16}, "other kernel or verifier sources"),
                        ({"target": "hopper"}, "of target 'hopper'"),
                        ({"outcomes": [{"nonsense": 1}]}, "not a mutants report")]:
        path = tmp_path / "r.json"
        path.write_text(json.dumps({**d, **change}))
        assert harness.main(["--target", "sc11", "--resume", str(path)]) == 2
        err = capsys.readouterr().err
        assert why in err and len(err.strip().splitlines()) == 1
    ok = tmp_path / "ok.json"
    ok.write_text(json.dumps(d))
    assert [o.mutant for o in harness.load_report(str(ok), "sc11").outcomes] == ["x"]


def test_cli_refuses_a_bad_shard(capsys):
    assert harness.main(["--target", "sc11", "--shard", "3/3"]) == 2
    assert "--shard must be K/N" in capsys.readouterr().err


def test_the_unmutated_name_runs_the_baselines_alone(monkeypatch):
    calls = _fake_runs(monkeypatch, False)
    rep = harness.run("sc11", ["smoke"], only=[harness.UNMUTATED], schedules=["sc11_attn"],
                      isolate=False)
    assert calls == [harness.UNMUTATED] and not rep.baselines
    assert [(o.mutant, o.schedule, o.caught) for o in rep.outcomes] == [
        (harness.UNMUTATED, "sc11_attn", False)]


# ---------------------------------------------------------------- real mutants, SC11 ---
@pytest.mark.parametrize("name", ["merged_empty_lse", "q_row_stride"])
def test_verify_smoke_catches_the_sc11_escape_class_mutants(name):
    """(a) heads that leave the last core short and (b) s_q > length > block_kv in a split
    sequence: mutants of each class, planted in the kernel source, caught by the real
    verify (smoke profile: the schedule's family, its path cases) on sc11_attn."""
    m = by_name(name)
    o = harness.run_one(m, "sc11_attn", "smoke")
    assert not o.error, o.error
    assert o.caught, f"{name} escaped verify --profile smoke on sc11_attn"


def test_the_unmutated_example_passes_smoke():
    from mlagen.verify import verify

    r = verify(example("sc11_attn"), profile="smoke", examples=5, progress=False)
    assert r.ok, r.summary()
    assert r.variants_built >= 6 and r.examples_run >= 40


@pytest.mark.slow
def test_every_sc11_mutant_is_caught_on_both_examples():
    rep = harness.run("sc11", ["smoke"])
    assert rep.ok(), rep.summary()
    assert len(rep.per_mutant()) == len(harness.mutants_for("sc11"))


@pytest.mark.slow
@pytest.mark.parametrize("m", harness.mutants_for("sc11"), ids=lambda m: m.name)
def test_every_sc11_mutant_compiles(m):
    assert harness.compile_check(m, example(m.schedules[0])) is None


@pytest.mark.nvcc
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("m", harness.mutants_for("hopper"), ids=lambda m: m.name)
def test_every_hopper_mutant_compiles(m):
    for name in m.schedules:
        assert harness.compile_check(m, example(name)) is None


# ---------------------------------------------------------------- Hopper, on the GPU ---
def gpu(f):
    return pytest.mark.cuda(pytest.mark.skipif(not torch.cuda.is_available(),
                                               reason="needs an NVIDIA GPU")(f))


ESCAPES = [("wgmma_sum_not_rescaled", "hopper_wgmma"),          # the max moves
           ("rows_sum_not_rescaled", "hopper_wgmma_r16"),
           ("rows_merge_first_max", "hopper_wgmma_r16_w8"),     # the second WG's max
           ("wgmma_page_offset", "hopper_wgmma"),               # pages > 64
           ("rows_page_offset", "hopper_wgmma_r16"),
           ("wgmma_bad_page_last", "hopper_wgmma"),             # the last page's check
           ("rows_merge_l_weight", "hopper_wgmma_r16_w8"),      # whole-sequence pieces
           ("fp8_scale_tile_pairs", "hopper_fp8_ds_mla"),       # the FP8 scales
           ("fp8_descale_first_seq", "hopper_fp8_e4m3"),
           ("sparse_extra_page_size", "hopper_sparse_two_pools"),   # the extra pool's page
           ("sparse_pool_split_late", "hopper_sparse_two_pools")]   # the pools' boundary


@gpu
@pytest.mark.parametrize("name,schedule", ESCAPES)
def test_verify_smoke_catches_the_hopper_escape_class_mutants(name, schedule):
    o = harness.run_one(by_name(name), schedule, "smoke")
    assert not o.error, o.error
    assert o.caught, f"{name} escaped verify --profile smoke on {schedule}"


@gpu
@pytest.mark.parametrize("schedule", ["hopper_wgmma", "hopper_wgmma_r16_w8", "hopper_h200",
                                      "hopper_sparse_two_pools"])
def test_unmutated_hopper_examples_pass_smoke(schedule):
    from mlagen.verify import verify

    r = verify(example(schedule), profile="smoke", progress=False)
    assert r.ok, r.summary()


def test_the_wall_limit_stops_a_run_and_says_where_it_was(tmp_path, monkeypatch):
    """A run still going at the wall limit is killed and reported not reached (never caught
    nor escaped), with the last line it wrote; those not started are not reached too."""
    import time

    monkeypatch.setenv("MLAGEN_CACHE_DIR", str(tmp_path))     # a cold build: seconds long
    m = by_name("merged_empty_lse")
    todo = [(m, "sc11_attn", "smoke"), (m, "sc11_fused_tp4", "smoke")]
    got = list(harness._in_processes(todo, 1, None, None, time.perf_counter() + 2.0))
    assert [o.schedule for o in got] == ["sc11_attn", "sc11_fused_tp4"]
    assert all(not o.caught and o.error.startswith("not reached: the harness's wall limit")
               for o in got)
    assert got[0].seconds >= 2.0 and got[1].seconds == 0.0


def test_children_skip_the_baseline_and_log_where_the_parent_reads(monkeypatch):
    """A child run verifies the mutant alone (the parent ran the baselines), and its log
    goes to the file whose last line the wall limit reports."""
    import json
    import subprocess
    import time

    seen = []

    class FakeProc:
        returncode = 0

        def __init__(self, cmd, stdout=None, stderr=None):
            seen.append((cmd, stdout, stderr))
            out = cmd[cmd.index("--out") + 1]
            m, n, prof = cmd[cmd.index("--only") + 1], cmd[cmd.index("--schedule") + 1], \
                cmd[cmd.index("--profile") + 1]
            Path(out).write_text(json.dumps({"outcomes": [dict(
                mutant=m, schedule=n, profile=prof, caught=True, how="mismatch")]}))

        def poll(self):
            return 0

    monkeypatch.setattr(subprocess, "Popen", FakeProc)
    m = by_name("merged_empty_lse")
    got = list(harness._in_processes([(m, "sc11_attn", "smoke")], 1, None, None,
                                     time.perf_counter() + 60))
    assert [o.caught for o in got] == [True]
    (cmd, stdout, stderr), = seen
    assert "--no-baseline" in cmd and "--in-process" in cmd
    assert stderr == subprocess.STDOUT and stdout is not None and stdout != subprocess.DEVNULL


def test_no_baseline_flag_reaches_the_run(monkeypatch):
    seen = {}

    def fake_run(*a, **kw):
        seen.update(kw)
        return harness.Report("sc11")

    monkeypatch.setattr(harness, "run", fake_run)
    harness.main(["--target", "sc11", "--only", "merged_empty_lse", "--in-process",
                  "--no-baseline"])
    assert seen["baseline"] is False


def test_a_failing_baseline_keeps_its_repro_file_and_a_mutant_run_does_not(monkeypatch):
    """A baseline that fails is a fault of the oracle or the unmutated kernel, to be studied
    (its repro file holds the inputs and the kernel's outputs); a mutant's catch is expected."""
    from mlagen.verify import runner
    seen = []

    def fake_verify(s, **kw):
        seen.append(kw["save_failures"])
        return runner.VerifyResult(schedule=s.name, variant="", profile="smoke", ok=True,
                                   examples_requested=1, examples_run=1, elapsed_s=0.0,
                                   setup_s=0.0)

    monkeypatch.setattr(runner, "verify", fake_verify)
    mutant = next(m for m in harness.mutants_for("sc11"))
    harness.run_one(harness._Unmutated("sc11"), "sc11_attn", "smoke")
    harness.run_one(mutant, mutant.schedules[0], "smoke")
    assert seen == [True, False]
