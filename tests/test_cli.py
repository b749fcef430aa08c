"""The CLI calls the public API; user errors are one line and a non-zero exit."""

import subprocess
import sys
from pathlib import Path

import pytest

from mlagen.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_check_examples(capsys):
    paths = sorted(str(p) for p in (ROOT / "schedules").glob("*.toml"))
    assert paths
    assert main(["check", "-v", *paths]) == 0
    out = capsys.readouterr().out
    for p in paths:
        assert f"{p}: ok" in out


def test_bad_schedule_is_one_line_no_traceback(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[problem]\nheads = 128\n\n[target]\nkind = "sc11"\n\n[schedule]\n'
                   'block_kv = 48\n')
    proc = subprocess.run([sys.executable, "-m", "mlagen.cli", "check", str(bad)],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert f"{bad}:8: block_kv = 48 must divide page_size = 64" in proc.stderr


def test_missing_file_is_a_clear_error(capsys):
    assert main(["check", "/nonexistent/sched.toml"]) == 2
    assert "cannot read schedule" in capsys.readouterr().err


def test_help_lists_every_command(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for cmd in ("check", "generate", "build", "run", "verify", "bench", "cache"):
        assert cmd in out


def test_cache_list_and_clear(capsys):
    assert main(["cache", "list"]) == 0
    assert main(["cache", "clear"]) == 0
    assert "removed" in capsys.readouterr().out


def test_bench_sc11_quick_writes_the_grid(tmp_path, capsys):
    out = tmp_path / "grid.md"
    assert main(["bench", "--target", "sc11", "--quick", "--output", str(out)]) == 0
    text = out.read_text()
    assert "## Best scheme" in text and "seed's point" in text
    assert "| 128 | 16384 |" in text           # the quick grid's corner


def test_bench_hopper_without_gpu_is_a_clear_error(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert main(["bench", "--target", "hopper"]) == 2
    assert "needs an NVIDIA sm_90 GPU" in capsys.readouterr().err


def test_run_sc11_example_checks_and_charts(tmp_path, capsys):
    prefix = tmp_path / "chart"
    assert main(["run", str(ROOT / "schedules" / "sc11_attn.toml"), "--batch", "4",
                 "--seqlen", "130", "--s-q", "2", "--chart", str(prefix)]) == 0
    out = capsys.readouterr().out
    assert "outputs match" in out and "simulated time" in out
    assert (tmp_path / "chart_all_cores.png").stat().st_size > 1000


def test_generate_copies_the_headers_it_includes(tmp_path, capsys):
    """The generated folder compiles on its own: every header it includes is beside it."""
    assert main(["generate", str(ROOT / "schedules" / "sc11_attn.toml"), "-o",
                 str(tmp_path)]) == 0
    out = capsys.readouterr().out
    d = tmp_path / "sc11_attn"
    assert (d / "include" / "mla.h").is_file() and "to compile by hand" in out
    proc = subprocess.run(["c++", "-std=c++17", "-fsyntax-only", "-Iinclude", "kernel.cpp"],
                          cwd=d, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
