"""Bad input at the command line: exit status 2, one line on stderr, no traceback, and
nothing written (no output files, no build cache entries, no repro files)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mlagen.cli import main

ROOT = Path(__file__).resolve().parents[1]
SC11 = str(ROOT / "schedules" / "sc11_attn.toml")
HOPPER = str(ROOT / "schedules" / "hopper_h200.toml")


@pytest.fixture
def bad_files(tmp_path):
    d = tmp_path / "inputs"
    d.mkdir()
    (d / "empty.toml").write_text("")
    (d / "blank.toml").write_text("  \n\n")
    (d / "binary.toml").write_bytes(bytes(range(256)) * 4)
    (d / "latin1.toml").write_bytes('[problem]\nname = "caf\xe9"\n'.encode("latin-1"))
    (d / "folder.toml").mkdir()
    (d / "huge.toml").write_bytes(b"# " + b"x" * (2 << 20) + b"\n")
    return d


@pytest.fixture
def clean(tmp_path, monkeypatch):
    """A fresh working folder and cache; returns a function that lists what was written."""
    work, cache = tmp_path / "work", tmp_path / "cache"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("MLAGEN_CACHE_DIR", str(cache))

    def written() -> list:
        return sorted(str(p) for p in work.rglob("*")) + \
            sorted(str(p) for p in cache.rglob("*") if p.is_file())
    return written


def refused(capsys, argv: list, *needles: str) -> str:
    """Run the CLI in this process; require exit 2 and exactly one line on stderr."""
    try:
        rc = main(argv)
    except SystemExit as e:          # argparse's usage errors
        rc = e.code
    out, err = capsys.readouterr()
    assert rc == 2, (argv, rc, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, (argv, err)
    assert "Traceback" not in err and lines[0].startswith("mlagen"), err
    for n in needles:
        assert n in lines[0], (argv, lines[0])
    return lines[0]


# ------------------------------------------------------------- schedule files ---------
@pytest.mark.parametrize("command", ["check", "generate", "build", "run", "verify"])
@pytest.mark.parametrize("name,needle", [
    ("empty.toml", "is empty"), ("blank.toml", "is empty"),
    ("binary.toml", "binary file"), ("latin1.toml", "not UTF-8"),
    ("folder.toml", "is a directory"), ("missing.toml", "No such file"),
    ("huge.toml", "larger than 1 MiB"),
])
def test_bad_schedule_files(command, name, needle, bad_files, clean, capsys):
    path = str(bad_files / name)
    refused(capsys, [command, path], path, needle)
    assert clean() == []


def test_a_bad_second_schedule_writes_nothing(bad_files, clean, capsys):
    refused(capsys, ["generate", SC11, str(bad_files / "binary.toml"), "-o", "out"])
    assert clean() == []


# ------------------------------------------------------------- numbers ----------------
@pytest.mark.parametrize("args,needle", [
    (["--batch", "0"], "--batch: must be at least 1, got 0"),
    (["--batch", "-1"], "--batch: must be at least 1, got -1"),
    (["--batch", "two"], "'two' is not a whole number"),
    (["--seqlen", "0"], "--seqlen: must be at least 1, got 0"),
    (["--seqlen", "-7"], "--seqlen: must be at least 1"),
    (["--s-q", "0"], "--s-q: must be at least 1"),
    (["--s-q", "3"], "max_s_q = 2"),
    (["--seed", "-1"], "--seed: must be at least 0"),
    (["--seqlen", str(2 ** 40)], "int32"),
    (["--scheme", "diagonal"], "must be one of"),
])
def test_run_refuses_bad_numbers(args, needle, clean, capsys):
    refused(capsys, ["run", SC11, *args], needle)
    assert clean() == []


@pytest.mark.parametrize("batch", ["1000000", "1000000000"])
def test_run_refuses_a_workload_that_cannot_fit_before_allocating(batch, clean, capsys):
    line = refused(capsys, ["run", SC11, "--batch", batch], f"batch {batch}", "needs about",
                   "iB of memory")
    assert "available" in line
    assert clean() == []


def test_memory_estimate_grows_with_the_workload():
    from mlagen import load_schedule
    from mlagen.console import human_bytes
    from mlagen.report import workload_bytes

    s = load_schedule(SC11)
    small, _ = workload_bytes(s, 4, 128, 1)
    big, _ = workload_bytes(s, 10 ** 6, 512, 1)
    cache = 10 ** 6 * 512 * s.problem.d * 2         # the bf16 cache alone
    assert small < 2 << 30 and big > cache
    assert human_bytes(1536) == "1.5 KiB" and human_bytes(3 * 2 ** 40) == "3.0 TiB"


@pytest.mark.parametrize("args,needle", [
    (["--examples", "0"], "--examples/-n: must be at least 1"),
    (["--examples", "-3"], "must be at least 1"),
    (["--seed", "-1"], "--seed: must be between 0"),
    (["--time-budget", "0"], "positive number of seconds"),
    (["--time-budget", "-5"], "positive number of seconds"),
    (["--time-budget", "nan"], "positive number of seconds"),
    (["--profile", "fast"], "invalid choice"),
])
def test_verify_refuses_bad_numbers(args, needle, clean, capsys):
    refused(capsys, ["verify", SC11, *args], needle)
    assert clean() == []


@pytest.mark.parametrize("argv,needle", [
    (["cache", "purge"], "invalid choice"),
    (["bench", "--target", "tpu"], "invalid choice"),
    (["frobnicate"], "invalid choice"),
    ([], "required"),
    (["check"], "required"),
    (["verify"], "give a schedule file"),
    (["generate"], "give a schedule file"),
])
def test_usage_errors_are_one_line(argv, needle, clean, capsys):
    refused(capsys, argv, needle)
    assert clean() == []


def test_output_paths_are_checked_before_the_work(tmp_path, clean, capsys):
    (tmp_path / "afile").write_text("x")
    refused(capsys, ["bench", "--output", str(tmp_path)], "must be a file, not a folder")
    refused(capsys, ["generate", SC11, "-o", str(tmp_path / "afile")], "must be a folder")
    refused(capsys, ["bench", "--output", str(tmp_path / "afile" / "x.md")], "is not a folder")
    assert clean() == []


def test_verify_json_path_is_checked_before_the_run(tmp_path, clean, capsys):
    (tmp_path / "afile").write_text("x")
    refused(capsys, ["verify", SC11, "--json", str(tmp_path)], "--json: is a directory")
    refused(capsys, ["verify", SC11, "--json", str(tmp_path / "afile" / "r.json")],
            "--json: no folder")
    assert clean() == []                     # refused before the build


def test_verify_json_records_the_result(tmp_path, clean, capsys):
    import json

    dest = tmp_path / "r.json"
    assert main(["verify", SC11, "-n", "2", "--profile", "ci", "--no-progress",
                 "--json", str(dest)]) == 0
    rec = json.loads(dest.read_text())
    assert rec["ok"] and rec["examples_run"] == 2 and rec["profile"] == "ci"
    assert set(rec["phase_s"]) == {"inputs", "reference", "kernel", "compare"}
    assert rec["failure"] is None and "PASS" in capsys.readouterr().out


@pytest.mark.parametrize("name,needle", [
    ("binary.toml", "not an mlagen verify repro file"),
    ("empty.toml", "not an mlagen verify repro file"),
    ("folder.toml", "is a directory"), ("missing.pt", "No such file"),
])
def test_verify_repro_bad_files(name, needle, bad_files, clean, capsys):
    refused(capsys, ["verify", "--repro", str(bad_files / name)], needle)
    assert clean() == []


# ------------------------------------------------------------- absent device ----------
@pytest.mark.parametrize("argv", [["verify", HOPPER, "-n", "2"], ["run", HOPPER],
                                  ["bench", "--target", "hopper"]])
def test_commands_needing_a_gpu_say_so_without_one(argv, clean, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    refused(capsys, argv, "needs an NVIDIA sm_90 GPU (none found)")
    assert clean() == []                     # no repro file, no build


def test_verify_without_gpu_starts_no_worker(clean, monkeypatch):
    """The real process, with the GPU hidden: exit 2 at once, no worker restarts."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "mlagen.cli", "verify", HOPPER, "-n", "2"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 2, proc
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert "needs an NVIDIA sm_90 GPU" in proc.stderr and "restart" not in proc.stderr
    assert proc.stdout == "" and clean() == []


# ------------------------------------------------------------- environment overrides --
@pytest.mark.parametrize("var,value,needle", [
    ("MLAGEN_HOPPER_TILE_KNOBS", '{"16": [16, 2', "is not JSON"),
    ("MLAGEN_HOPPER_WGMMA_KNOBS", '{"48": [64, 64, 2, 8]}', 'class "48" must be one of'),
    ("MLAGEN_HOPPER_MAINLOOP", '{"16": "cutlass"}', '"cutlass" must be "mma_sync" or'),
    ("MLAGEN_HOPPER_CLUSTER", "off", "'off' must be 0 (no thread-block clusters) or 1"),
])
@pytest.mark.parametrize("argv", [["bench", "--target", "hopper"],
                                  ["tune", "--target", "hopper", "--shape", "1,1,64,16"]])
def test_malformed_overrides_are_refused_before_the_device(argv, var, value, needle, clean,
                                                           capsys, monkeypatch):
    """Checked before the GPU is looked for: the same line on any machine."""
    monkeypatch.setenv(var, value)
    line = refused(capsys, argv, var, needle)
    assert "GPU" not in line
    assert clean() == []


def test_malformed_override_real_process(clean):
    env = dict(os.environ, PYTHONPATH=str(ROOT), MLAGEN_HOPPER_WGMMA_KNOBS='{"64": [64, 64]}')
    proc = subprocess.run([sys.executable, "-m", "mlagen.cli", "bench", "--target", "hopper"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 2, proc
    assert proc.stderr.strip().splitlines() == [
        'mlagen: MLAGEN_HOPPER_WGMMA_KNOBS: class "64": [64, 64] must be [rows_per_tile, '
        'block_kv, buffers, warps] (integers)'], proc.stderr
    assert proc.stdout == "" and clean() == []


# ------------------------------------------------------------- pipes ---------------
def test_closed_pipe_is_quiet(tmp_path):
    """`mlagen ... | head`: no "Broken pipe", no traceback."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    paths = sorted(str(p) for p in (ROOT / "schedules").glob("*.toml"))
    p = subprocess.Popen([sys.executable, "-m", "mlagen.cli", "check", "-v", *paths] * 1,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    p.stdout.close()                           # the reader leaves before a line is written
    err = p.stderr.read().decode()
    p.wait(timeout=120)
    assert "Broken pipe" not in err and "BrokenPipeError" not in err and "Traceback" not in err
    assert p.returncode in (0, 141)


# ------------------------------------------------------------- --flashmla -------------
def test_bench_flashmla_library_is_checked_before_the_device(tmp_path, clean, capsys):
    """A missing or foreign library is refused in one line on any machine, GPU or not."""
    missing = str(tmp_path / "libflashmla.so")
    line = refused(capsys, ["bench", "--target", "hopper", "--flashmla", missing],
                   f"--flashmla {missing}: no such file")
    assert "GPU" not in line
    notlib = tmp_path / "notlib.so"
    notlib.write_text("not an ELF file")
    refused(capsys, ["bench", "--target", "hopper", "--flashmla", str(notlib)],
            "not a FlashMLA library with the shim of benchmarks/flashmla/shim.cu")
    refused(capsys, ["bench", "--target", "sc11", "--flashmla", str(notlib)],
            "target sc11 has no FlashMLA reference to time")
    assert clean() == []


def test_bench_vllm_fp8_extension_is_checked_before_the_device(tmp_path, clean, capsys):
    """--vllm-fp8: it needs fp8_e4m3 rows; a missing or foreign file is refused in one line
    on any machine."""
    missing = str(tmp_path / "dense_fp8.so")
    refused(capsys, ["bench", "--target", "hopper", "--shape", "1,1,256,16",
                     "--vllm-fp8", missing], "--vllm-fp8 times vLLM's kernel on the fp8_e4m3")
    refused(capsys, ["bench", "--target", "hopper", "--shape", "1,1,256,16", "--kv-format",
                     "fp8_e4m3", "--vllm-fp8", missing], f"--vllm-fp8 {missing}: no such file")
    notlib = tmp_path / "notlib.so"
    notlib.write_text("not an ELF file")
    refused(capsys, ["bench", "--target", "hopper", "--shape", "1,1,256,16", "--kv-format",
                     "fp8_e4m3", "--vllm-fp8", str(notlib)],
            "not vLLM's dense FP8 FlashMLA extension")
    refused(capsys, ["bench", "--target", "sc11", "--vllm-fp8", str(notlib)],
            "target sc11 has no vLLM kernel to time")
    assert clean() == []


def test_bench_fp8_mma_is_refused_off_the_register_path(clean, capsys):
    """--fp8-mma mma: fp8_e4m3 rows on the register path only (the e4m3 MMAs' kernel)."""
    refused(capsys, ["bench", "--target", "hopper", "--shape", "128,1,8192,16",
                     "--fp8-mma", "mma"], "give --kv-format fp8_e4m3 too")
    refused(capsys, ["bench", "--target", "hopper", "--shape", "4,1,8192,16", "--kv-format",
                     "bf16,fp8_e4m3", "--fp8-mma", "mma"],
            "shape 4,1,8192,16 is not on the register path")
    refused(capsys, ["bench", "--target", "hopper", "--shape", "128,2,8192,16",
                     "--kv-format", "fp8_e4m3", "--fp8-mma", "mma"], "s_q * h_q <= 16")
    refused(capsys, ["bench", "--target", "sc11", "--fp8-mma", "mma"], "another target's knob")
    assert clean() == []


# ------------------------------------------------------------- bench --shape ----------
def test_bench_shapes_are_checked_before_the_device(clean, capsys):
    """A malformed --shape, --shape with --quick, and --shape for a target that benchmarks
    a grid are refused in one line on any machine, GPU or not, before anything runs."""
    line = refused(capsys, ["bench", "--target", "hopper", "--shape", "16,2,2048"],
                   "shape '16,2,2048': expected b,s_q,s_k,h_q[,varlen]")
    assert "GPU" not in line
    refused(capsys, ["bench", "--target", "hopper", "--shape", "1,1,1024,16",
                     "--shape", "8,1,4096,256"], "shape '8,1,4096,256': needs", "h_q 1..128")
    refused(capsys, ["bench", "--target", "hopper", "--quick", "--shape", "1,1,1024,16"],
            "--quick", "give one or the other")
    refused(capsys, ["bench", "--target", "sc11", "--shape", "1,1,1024,16"],
            "--shape: target sc11's bench is its scheme grid")
    assert clean() == []


# ------------------------------------------------------------- environment variables --
@pytest.mark.parametrize("var,value,needle", [
    ("MLAGEN_CACHE_DIR", "~nosuchuser/x", "~nosuchuser does not expand"),
    ("MLAGEN_CACHE_DIR", "{file}", "is a file, not a folder"),
    ("MLAGEN_CACHE_DIR", "{file}/sub", "is a file, not a folder"),
    ("XDG_CACHE_HOME", "{file}", "is a file, not a folder"),
    ("MLAGEN_BUILD_JOBS", "lots", "'lots' is not a whole number"),
    ("MLAGEN_BUILD_JOBS", "0", "must be at least 1"),
    ("CXX", "no-such-compiler-x", "no such program"),
    ("CXX", " ", "set but empty"),
    ("CUDA_HOME", "~nosuchuser", "does not expand"),
    ("CUDA_PATH", "{file}", "is not a folder"),
    ("MLAGEN_VERIFY_PROFILE", "fast", "must be one of smoke, ci, explore"),
    ("MLAGEN_COMMIT", "a\nb", "must be one short line"),
    ("MLAGEN_HOPPER_FASTCALL", "yes", "must be 0 (off) or 1 (on)"),
    ("MLAGEN_HOPPER_STRICT", "on", "must be 0 (off) or 1 (on)"),
    ("MLAGEN_HOPPER_TUNE_TABLE", "{dir}", "is a folder, not a file"),
    ("MLAGEN_HOPPER_TUNE_TABLE", "~nosuchuser/t.json", "does not expand"),
])
@pytest.mark.parametrize("argv", [["cache", "list"], ["cache", "clear"], ["check", SC11]])
def test_malformed_environment_variables_are_named_up_front(var, value, needle, argv,
                                                            tmp_path, clean, capsys,
                                                            monkeypatch):
    afile = tmp_path / "afile"
    afile.write_text("x")
    monkeypatch.setenv(var, value.format(file=afile, dir=tmp_path))
    line = refused(capsys, argv, f"mlagen: {var}: ", needle)
    assert len(line.replace(str(tmp_path), "TMP")) < 200   # the line, less pytest's own folder
    assert afile.read_text() == "x" and clean() == []


def test_a_cache_folder_that_is_a_file_is_refused_by_the_api(tmp_path, monkeypatch):
    from mlagen.errors import MlagenError
    from mlagen.jit import entries
    from mlagen.paths import cache_dir

    (tmp_path / "afile").write_text("x")
    monkeypatch.setenv("MLAGEN_CACHE_DIR", str(tmp_path / "afile"))
    with pytest.raises(MlagenError, match="MLAGEN_CACHE_DIR: .* is a file, not a folder"):
        entries()                      # not "0 builds"
    monkeypatch.setenv("MLAGEN_CACHE_DIR", "~nosuchuser/cache")
    with pytest.raises(MlagenError, match="~nosuchuser does not expand"):
        cache_dir()


def test_build_jobs_is_named_by_the_build_not_the_compiler(tmp_path, monkeypatch):
    from mlagen.codegen import SourceSet
    from mlagen.errors import BuildError, MlagenError
    from mlagen.jit import build

    monkeypatch.setenv("MLAGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("MLAGEN_BUILD_JOBS", "lots")
    ss = SourceSet(variant="envtest", target="buildtest", files={"a.cpp": "int f();\n"},
                   include_dirs=(), compiler="c++", flags=(), sources=("a.cpp",))
    with pytest.raises(MlagenError) as info:
        build(ss)
    assert not isinstance(info.value, BuildError)
    assert str(info.value) == "MLAGEN_BUILD_JOBS: 'lots' is not a whole number"


@pytest.mark.parametrize("env,needle", [
    (dict(RANK="x", WORLD_SIZE="2"), "RANK: 'x' is not a whole number"),
    (dict(RANK="2", WORLD_SIZE="2"), "RANK: '2' must be below WORLD_SIZE"),
    (dict(RANK="0", WORLD_SIZE="two"), "WORLD_SIZE: 'two' is not a whole number"),
    (dict(RANK="0", WORLD_SIZE="2", LOCAL_RANK="-1"), "LOCAL_RANK: '-1' must be at least 0"),
])
def test_a_malformed_torchrun_environment_is_named(env, needle, monkeypatch):
    from mlagen.errors import MlagenError
    from mlagen.parallel import init_from_env

    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(MlagenError, match=needle.replace("(", r"\(")):
        init_from_env()


# ------------------------------------------------------------- finding a schedule -----
@pytest.mark.parametrize("name", ["sc11_attn", "sc11_attn.toml", "schedules/sc11_attn.toml",
                                  "schedules/sc11_attn"])
def test_every_way_in_finds_a_shipped_schedule_by_name(name, clean, capsys, monkeypatch):
    """Outside a checkout (the working folder has no schedules/): load_schedule, verify,
    bench --schedule, run, check, build and generate follow one rule."""
    import mlagen
    from mlagen.backends.sc11 import bench as sc11_bench
    from mlagen.verify import runner

    assert not Path("schedules").exists()
    s = mlagen.load_schedule(name)
    assert s.name == "sc11_attn" and Path(s.source) == ROOT / "schedules" / "sc11_attn.toml"
    assert sc11_bench._schedule(name).name == "sc11_attn"

    seen = []

    def stop(schedule, **kw):
        seen.append(schedule.name)
        raise mlagen.MlagenError("stopped here")
    monkeypatch.setattr(runner, "verify", stop)
    monkeypatch.setattr(sc11_bench, "seed_point",
                        lambda schedule, **kw: stop(sc11_bench._schedule(schedule)))
    refused(capsys, ["verify", name, "-n", "1"], "stopped here")
    assert main(["bench", "--target", "sc11", "--schedule", name]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == "mlagen: stopped here"
    assert seen == ["sc11_attn", "sc11_attn"]
    assert main(["check", name]) == 0 and "ok" in capsys.readouterr().out


def test_a_path_that_is_there_wins_over_a_shipped_name(clean, capsys):
    import mlagen

    Path("schedules").mkdir()
    mine = (ROOT / "schedules" / "sc11_attn.toml").read_text().replace(
        "[problem]", "[problem]\n# my own copy", 1)
    Path("schedules/sc11_attn.toml").write_text(mine)
    s = mlagen.load_schedule("schedules/sc11_attn.toml")
    assert Path(s.source) == Path("schedules/sc11_attn.toml")
    with pytest.raises(mlagen.ScheduleError, match="No such file"):
        mlagen.load_schedule("elsewhere/sc11_attn.toml")    # only bare and schedules/ names


# ------------------------------------------------------------- output paths -----------
def _unwritable(tmp_path) -> Path:
    """A folder no file can be created in, even by root (a read-only mount)."""
    if os.geteuid() != 0:
        d = tmp_path / "readonly"
        d.mkdir()
        d.chmod(0o500)
        return d
    return Path("/sys")


def test_outputs_in_an_unwritable_place_are_refused_before_the_work(tmp_path, clean, capsys):
    ro = _unwritable(tmp_path)
    refused(capsys, ["run", SC11, "--chart", str(ro / "charts" / "t")], "--chart",
            "cannot write in")
    refused(capsys, ["bench", "--target", "sc11", "--output", str(ro / "b.md")], "--output",
            "cannot write in")
    refused(capsys, ["generate", SC11, "-o", str(ro / "gen")], "-o", "cannot write in")
    refused(capsys, ["generate", "--examples", "-o", str(ro / "gen")], "-o", "cannot write in")
    refused(capsys, ["tune", "--target", "hopper", "--table", str(ro / "t.json")], "--table",
            "cannot write in")
    (tmp_path / "afile").write_text("x")
    refused(capsys, ["run", SC11, "--chart", str(tmp_path / "afile" / "t")], "is not a folder")
    assert clean() == []


def test_generate_refuses_two_schedules_writing_into_one_folder(tmp_path, clean, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    for d, heads in ((a, 128), (b, 64)):
        d.mkdir()
        (d / "attn.toml").write_text((ROOT / "schedules" / "sc11_attn.toml").read_text()
                                     .replace("heads = 128", f"heads = {heads}"))
    # relative names: an absolute one under pytest's folder can be long enough to be cut
    ra, rb = "../a/attn.toml", "../b/attn.toml"
    line = refused(capsys, ["generate", ra, rb, "-o", "out"], ra, rb, "out/attn",
                   "separate folders")
    assert clean() == []
    # the same file twice (by two names) is written once
    assert main(["generate", str(a / "attn.toml"), str(a / ".." / "a" / "attn.toml"),
                 "-o", "out"]) == 0
    assert Path("out/attn/kernel.cpp").is_file()
    assert main(["generate", "sc11_attn", "schedules/sc11_attn.toml", "-o", "out"]) == 0


BIG = "x" * 500_000


@pytest.mark.parametrize("text,needle", [
    (f'[problem]\nheads = 128\n[target]\nkind = "sc11"\n[schedule]\nscheme = "{BIG}"\n',
     "must be one of auto"),
    (f'[problem]\nheads = "{BIG}"\n[target]\nkind = "sc11"\n', "must be an integer"),
    (f'[problem]\n{BIG} = 1\n[target]\nkind = "sc11"\n', "unknown key"),
    (f'[problem]\nheads = 128\n[target]\nkind = "{BIG}"\n', "unknown target"),
    (f'[problem]\nheads = 128\ndtype = "{BIG}"\n[target]\nkind = "sc11"\n', "dtype ="),
    (f'[{BIG}]\nheads = 128\n', "unknown table"),
], ids=["scheme", "heads", "key", "kind", "dtype", "table"])
def test_a_500kb_value_in_a_schedule_is_echoed_short(text, needle, tmp_path, clean, capsys):
    (tmp_path / "big.toml").write_text(text)
    line = refused(capsys, ["check", str(tmp_path / "big.toml")], needle, "characters)")
    assert "x" * 80 not in line and len(line) < 1000, line[:400]


@pytest.mark.parametrize("argv", [
    ["bench", "--target", "sc11", "--output", f"/sys/{BIG}/b.md"],
    ["check", BIG[:100_000]],
    ["run", SC11, "--scheme", BIG[:100_000]],
    ["run", SC11, "--batch", BIG[:100_000]],
    ["bench", "--target", BIG[:100_000]],
], ids=["output", "schedule", "scheme", "batch", "target"])
def test_a_500kb_argument_is_echoed_short(argv, clean, capsys):
    line = refused(capsys, argv, "characters)")
    assert "x" * 80 not in line and "y" * 80 not in line and len(line) < 300, line[:400]


def test_a_byte_order_mark_is_accepted(tmp_path, clean, capsys):
    """Windows editors save UTF-8 with a BOM; tomllib alone calls it "Invalid statement
    (column 1)"."""
    import mlagen

    text = (ROOT / "schedules" / "sc11_attn.toml").read_text()
    bom = tmp_path / "bom.toml"
    bom.write_bytes(b"\xef\xbb\xbf" + text.encode())
    s = mlagen.load_schedule(bom)
    assert s == dataclasses.replace(mlagen.load_schedule(SC11), name="bom", source=str(bom))
    assert main(["check", str(bom)]) == 0 and "ok" in capsys.readouterr().out
    # an error further down still names its own line
    bad = tmp_path / "bad.toml"
    bad.write_bytes(b"\xef\xbb\xbf" + text.replace("[target]", "[target]\nnope = 1", 1).encode())
    line = refused(capsys, ["check", str(bad)], "unknown key 'nope'")
    want = text.splitlines().index("[target]") + 2
    assert f"bad.toml:{want}:" in line
