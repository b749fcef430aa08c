"""BENCHMARKS.md's tables are generated from the committed records (benchmarks/report.py),
and benchmarks/ holds what reproduces a published figure: records named by what they
record, device and commit; no experiment patches; every benchmarks/ path the tree cites
exists."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"


def _tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if out.returncode == 0 and out.stdout:
        return out.stdout.split()
    return [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file()
            and ".git" not in p.parts]


def _report():
    spec = importlib.util.spec_from_file_location("bench_report", BENCH / "report.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_benchmarks_md_holds_exactly_what_the_records_generate():
    report = _report()
    page = (ROOT / "BENCHMARKS.md").read_text()
    assert report.generated_part(page) == report.render(), \
        "BENCHMARKS.md is stale: run `python benchmarks/report.py --write`"


def test_the_current_table_is_the_newest_record_and_follows_its_figures(tmp_path):
    report = _report()
    shutil.copytree(BENCH / "results", tmp_path / "r")
    runs = report.records("hopper_bench", tmp_path / "r")
    newest = runs[-1]
    text = report.render(tmp_path / "r")
    assert f"commit `{newest['commit']}`" in text.split("## SC11")[0]
    # a figure changed in the record shows in the table
    path = tmp_path / "r" / newest["_file"]
    d = json.loads(path.read_text())
    d["rows"][0]["eager_ms"] = 123.4567
    path.write_text(json.dumps(d))
    assert "| 123.4567 |" in report.render(tmp_path / "r")
    assert "| 123.4567 |" not in text


def test_records_are_named_by_what_device_and_commit():
    names = sorted(f.removeprefix("benchmarks/results/") for f in _tracked()
                   if f.startswith("benchmarks/results/"))
    assert names, "no records"
    for name in names:
        d = json.loads((BENCH / "results" / name).read_text())
        # a mutation run is named by its target and check (its device is in the file)
        mut = re.fullmatch(r"mutants_(sc11|hopper)_(smoke|ci|compile)_([0-9a-f]{7,})\.json", name)
        if mut:
            assert d.get("commit", mut.group(3)) == mut.group(3), name
            continue
        m = re.fullmatch(r"(hopper_bench|hopper_formats|hopper_shapes|hopper_sparse_model1|hopper_sparse|sc11_grid|"
                         r"cpu_times|verify_times)_([a-z0-9_]+?)_([0-9a-f]{7,})\.json", name)
        assert m, f"benchmarks/results/{name}: not <what>_<device>_<commit>.json"
        assert d["commit"] == m.group(3), name
        assert d["commit_date"], name
        tag = "_".join(w.lower() for w in d["device"].split() if w.upper() != "NVIDIA")
        assert tag == m.group(2), name


def test_benchmarks_outside_results_is_small_and_holds_no_patches():
    files = _tracked()
    assert not [f for f in files if f.endswith((".patch", ".diff"))]
    lines = sum(len((ROOT / f).read_text(errors="replace").splitlines()) for f in files
                if f.startswith("benchmarks/") and not f.startswith("benchmarks/results/"))
    assert lines <= 2500, lines


# a cited path: benchmarks/<name>, not after "<commit>:" (a file at that commit, in history)
CITED = re.compile(r"(?<![\w:/.-])benchmarks/[\w./-]*\w")


def test_every_benchmarks_path_the_tree_cites_exists():
    missing = []
    me = Path(__file__).resolve().relative_to(ROOT).as_posix()
    for f in _tracked():
        if f == me or not f.endswith((".md", ".py", ".toml", ".cuh", ".j2", ".sh", ".cu", ".cpp")):
            continue
        for i, line in enumerate((ROOT / f).read_text(errors="replace").splitlines(), 1):
            for m in CITED.finditer(line):
                template = line[m.end():m.end() + 1] == "<"     # .../hopper_bench_<device>_...
                if not template and not (ROOT / m.group(0)).exists():
                    missing.append(f"{f}:{i}: {m.group(0)}")
    assert not missing, "cited but not in the tree:\n" + "\n".join(missing)


def test_the_citation_check_sees_a_missing_path():
    assert CITED.search("see benchmarks/gone_probe.py for it").group(0) == \
        "benchmarks/gone_probe.py"
    assert not CITED.search("at 5569878:benchmarks/gone_probe.py")


def test_the_pages_stay_reference_sized():
    """BENCHMARKS.md is the current table and one line per figure that moved, docs/hopper.md
    the reference (the work log is in the history)."""
    assert len((ROOT / "BENCHMARKS.md").read_text().splitlines()) <= 300
    assert len((ROOT / "docs" / "hopper.md").read_text().splitlines()) <= 500
