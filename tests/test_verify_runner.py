"""verify(): passes a correct runner, catches wrong ones, shrinks, saves and replays repros,
catches unwritten outputs through poisoning, and survives crashing workers."""

import argparse
import io

import pytest
import torch

from mlagen.errors import InputError
from mlagen.problem import MlaOutputs
from mlagen.schedule.parse import dumps
from mlagen.verify import repro, verify
from mlagen.verify.cli import add_verify_arguments, verify_main
from mlagen.verify.runner import replay
from mlagen.verify.strategies import Bounds, default_base

from verify_helpers import RefRunner, reference64

SC11 = default_base("sc11")
SMALL = Bounds(max_batch=3, max_len=150, long_len=600, max_extra_table=2)


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MLAGEN_CACHE_DIR", str(tmp_path / "cache"))


def run(runner, examples=40, **kw):
    kw.setdefault("bounds", SMALL)
    return verify(SC11, examples=examples, runner=runner, reference=reference64,
                  progress=False, **kw)


def test_correct_runner_passes():
    r = run(RefRunner(), examples=60)
    assert r.ok, r.summary()
    assert r.examples_run == 60 and r.poisoned and r.failure is None
    assert "PASS" in r.summary()


def test_wrong_scale_fails_and_shrinks():
    r = run(RefRunner(scale_factor=1.01))
    assert not r.ok and r.failure.kind == "mismatch"
    f = r.failure.case_fields
    # the smallest failing case: one sequence of one key, one query token
    assert f["batch"] == 1 and f["s_q"] == 1 and f["seqlens"] == [1], r.failure.case
    assert "lse" in r.failure.message and "elements wrong" in r.failure.message


def test_dropped_key_fails_and_repro_replays_it():
    r = run(RefRunner(drop_last_key=True))
    assert not r.ok
    path = r.failure.repro_file
    assert path is not None and path.exists() and r.failure.command == \
        f"mlagen verify --repro {path}"
    saved = repro.load(path)
    assert dumps(saved.schedule) == dumps(SC11)
    assert saved.inputs.cache_seqlens.tolist() == r.failure.case_fields["seqlens"]
    again = replay(path, runner=RefRunner(drop_last_key=True), reference=reference64)
    assert not again.ok and again.failure.kind == "mismatch"
    fixed = replay(path, runner=RefRunner(), reference=reference64)
    assert fixed.ok, fixed.summary()
    # the kernel's outputs travel with the file: the mismatch can be studied off the GPU
    got = RefRunner(drop_last_key=True)(saved.inputs)
    assert saved.actual is not None
    assert torch.equal(saved.actual.out, got.out.cpu()) and torch.equal(saved.actual.lse,
                                                                          got.lse.cpu())
    assert not torch.equal(saved.actual.out, RefRunner()(saved.inputs).out.cpu())


def test_unwritten_element_is_caught_by_poisoning():
    inner = RefRunner()

    def lazy(inp, out=None):             # writes everything but one output element
        r = inner(inp)
        keep = out.out[0, 0, 0, 0].clone()
        out.out.copy_(r.out)
        out.lse.copy_(r.lse)
        out.out[0, 0, 0, 0] = keep       # still the poison
        return out

    r = run(lazy)
    assert not r.ok and "NaN" in r.failure.message


def test_runner_without_out_is_noted():
    def plain(inp):
        return RefRunner()(inp)

    r = run(plain, examples=10)
    assert r.ok and not r.poisoned
    assert "not NaN-poisoned" in r.summary()


def test_raising_runner_is_a_failure_not_a_crash_of_verify():
    def boom(inp, out=None):
        if int(inp.cache_seqlens.max()) > 64:
            raise RuntimeError("index out of range")
        return RefRunner()(inp, out=out)

    r = run(boom)
    assert not r.ok and r.failure.kind == "error"
    assert "index out of range" in r.failure.message
    assert max(r.failure.case_fields["seqlens"]) == 65       # shrunk to the threshold


def test_reading_nan_pages_is_caught():
    """A runner that reads the whole last page (tail included) sees its NaN."""
    def overread(inp, out=None):
        page = inp.page_size
        longer = inp.cache_seqlens.clone()
        longer = ((longer + page - 1) // page).clamp_min(1) * page
        import dataclasses
        return RefRunner()(dataclasses.replace(inp, cache_seqlens=longer.int()), out=out)

    r = run(overread)
    assert not r.ok and "NaN" in r.failure.message


def test_derandomized_runs_repeat_and_seed_changes_them():
    seen = {0: [], 1: [], 2: []}

    def recorder(k):
        def fn(inp, out=None):
            seen[k].append(tuple(inp.cache_seqlens.tolist()))
            return RefRunner()(inp, out=out)
        return fn

    run(recorder(0), examples=15)
    run(recorder(1), examples=15)
    run(recorder(2), examples=15, seed=1234)
    assert seen[0] == seen[1] and seen[0] != seen[2]


def test_time_budget_stops_early_and_says_so():
    r = run(RefRunner(), examples=10_000, time_budget_s=0.5)
    assert r.ok and r.budget_spent and 0 < r.examples_run < 10_000
    assert "time budget" in r.summary()


def test_profile_from_environment(monkeypatch):
    monkeypatch.setenv("MLAGEN_VERIFY_PROFILE", "explore")
    r = run(RefRunner(), examples=5)
    assert r.profile == "explore" and r.ok
    monkeypatch.setenv("MLAGEN_VERIFY_PROFILE", "nope")
    with pytest.raises(ValueError, match="unknown verification profile"):
        run(RefRunner(), examples=5)


def test_explore_profile_remembers_failures(tmp_path):
    from mlagen.verify.profiles import database_dir

    r = run(RefRunner(scale_factor=1.01), profile="explore", examples=20)
    assert not r.ok
    assert database_dir().exists() and any(database_dir().rglob("*"))


def test_isolated_worker_survives_crashes():
    """Examples run in a child; one that kills the process fails alone, as a crash."""
    r = verify(SC11, examples=25, reference=reference64, progress=False, isolate=True,
               device="cpu", runner_factory="verify_helpers:crash_on_long_factory",
               bounds=SMALL, shrink_budget_s=10)
    assert not r.ok and r.failure.kind == "crash"
    assert "exit code 17" in r.failure.message
    assert max(r.failure.case_fields["seqlens"]) > 100
    assert any("restarted" in n for n in r.notes)


def test_isolated_worker_passes_a_correct_runner():
    r = verify(SC11, examples=8, reference=reference64, progress=False, isolate=True,
               device="cpu", runner_factory="verify_helpers:ref_runner_factory",
               bounds=SMALL)
    assert r.ok and r.examples_run == 8 and r.poisoned, r.summary()


def test_cli_errors_exit_2(tmp_path):
    parser = add_verify_arguments(argparse.ArgumentParser())
    out = io.StringIO()
    assert verify_main(parser.parse_args([]), out, out) == 2
    assert verify_main(parser.parse_args([str(tmp_path / "missing.toml")]), out, out) == 2
    assert "cannot read schedule" in out.getvalue()
    bad = tmp_path / "bad.pt"
    torch.save({"x": 1}, bad)
    assert verify_main(parser.parse_args(["--repro", str(bad)]), out, out) == 2
    assert "not an mlagen verify repro file" in out.getvalue()
    with pytest.raises(SystemExit):
        parser.parse_args(["x.toml", "--profile", "fast"])


def test_progress_display_runs():
    r = verify(SC11, examples=5, runner=RefRunner(), reference=reference64, progress=True,
               bounds=SMALL)
    assert r.ok


def test_missing_outputs_are_reported():
    def none_lse(inp, out=None):
        r = RefRunner()(inp)
        return MlaOutputs(out=r.out, lse=None)

    r = run(none_lse, examples=5)
    assert not r.ok and "missing" in r.failure.message


def test_schemes_are_drawn_and_a_bad_one_is_named():
    """On SC11 with scheme = "auto" a runner taking scheme= is run under every scheme."""
    used = set()

    def by_scheme(inp, out=None, scheme=None):
        used.add(scheme)
        wrong = {"scale_factor": 1.01} if scheme == "seq" else {}
        return RefRunner(**wrong)(inp, out=out)

    r = run(by_scheme, examples=60)
    assert not r.ok and r.failure.case_fields["scheme"] == "seq"
    assert "scheme seq" in r.failure.case
    assert {"auto", "seq"} <= used
    again = replay(r.failure.repro_file, runner=by_scheme, reference=reference64)
    assert not again.ok and "scheme seq" in again.failure.case

    def fine(inp, out=None, scheme=None):
        used.add(scheme)
        return RefRunner()(inp, out=out)

    used.clear()
    r = run(fine, examples=120)    # enough draws to meet all five schemes
    assert r.ok and used == {"auto", "heads", "batch", "seq", "batch_seq"}
    assert any("schemes drawn" in n for n in r.notes)
    fixed = SC11.replace(scheme="batch")
    used.clear()
    r = verify(fixed, examples=10, runner=fine, reference=reference64, progress=False,
               bounds=SMALL)
    assert r.ok and used == {None}          # a schedule that names its scheme keeps it


class _Payload:
    """An object a pickle would rebuild by calling code: a repro file never holds one."""

    def __reduce__(self):
        return (print, ("code ran while loading a repro file",))


def test_a_repro_file_with_pickled_code_is_refused_unrun(tmp_path, capsys):
    path = tmp_path / "evil.pt"
    torch.save({"format": repro.FORMAT, "x": _Payload()}, path)
    with pytest.raises(InputError, match="not an mlagen verify repro file"):
        repro.load(path)
    assert "code ran" not in capsys.readouterr().out
