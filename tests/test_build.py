"""The build cache (mlagen.jit): keys, cache hits, one build among racing processes,
killed builds, compiler errors, cache listing and clearing.

A tiny SourceSet (one C++ file with an extern "C" function) stands in for a kernel; a
compiler wrapper given through $CXX counts compiles and can be told to sleep."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from mlagen.jit import build, cache_key, clear, compile_only, entries
from mlagen.jit import cache as cache_mod
from mlagen.codegen import SourceSet
from mlagen.errors import BuildError
from mlagen.runtime import load_library

ROOT = Path(__file__).resolve().parents[1]
ADD = 'extern "C" int mlagen_test_add(int a, int b) { return a + b + %d; }\n'


def tiny(variant: str = "buildtest_add", offset: int = 0, flags=("-O1",),
         text: str | None = None) -> SourceSet:
    return SourceSet(variant=variant, target="buildtest",
                     files={"add.cpp": text if text is not None else ADD % offset},
                     include_dirs=(), compiler="c++", flags=tuple(flags),
                     sources=("add.cpp",))


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    d = tmp_path / "cache"
    monkeypatch.setenv("MLAGEN_CACHE_DIR", str(d))
    return d


@pytest.fixture
def wrapper(tmp_path, monkeypatch):
    """$CXX = a script that logs each compile (-c) to a counter file, sleeps
    $MLAGEN_TEST_SLEEP seconds, then runs the real compiler."""
    counter = tmp_path / "compiles.log"
    script = tmp_path / "cxx-wrapper.sh"
    script.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        case " $* " in
          *" -c "*) echo "$$" >> "{counter}"; sleep "${{MLAGEN_TEST_SLEEP:-0}}";;
        esac
        exec g++ "$@"
        """))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("CXX", str(script))
    cache_mod.compiler_version.cache_clear()

    def compiles() -> int:
        return len(_pids(counter))

    compiles.counter = counter
    yield compiles
    cache_mod.compiler_version.cache_clear()


def _pids(counter: Path) -> list[str]:
    return counter.read_text().split() if counter.exists() else []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def _call(lib_path: Path, a: int = 2, b: int = 3) -> int:
    return load_library(lib_path).mlagen_test_add(a, b)


# ------------------------------------------------------------------ cache hits ---------
def test_build_then_cache_hit(cache, wrapper):
    first = build(tiny())
    assert first.built and first.path.is_file() and first.path.parent.parent == cache / "builds"
    assert _call(first.path) == 5
    assert wrapper() == 1
    t0 = time.perf_counter()
    second = build(tiny())
    warm = time.perf_counter() - t0
    assert not second.built and second.path == first.path and second.key == first.key
    assert wrapper() == 1, "a cache hit must not compile"
    assert warm <= 0.2 and second.seconds <= 0.2, f"warm path took {warm:.3f} s"
    meta = json.loads((first.directory / "meta.json").read_text())
    assert meta["variant"] == "buildtest_add" and meta["flags"] == ["-O1"]


def test_lost_library_is_rebuilt(cache, wrapper):
    a = build(tiny())
    a.path.unlink()                       # a damaged entry: directory without its library
    b = build(tiny())
    assert b.built and b.path.is_file() and wrapper() == 2


# ------------------------------------------------------------------ keys ---------------
def test_key_names_the_variant_and_is_stable(cache):
    k = cache_key(tiny())
    assert k.startswith("buildtest_add-") and len(k.split("-")[-1]) == 16
    assert cache_key(tiny()) == k


def test_key_changes_with_source_flags_version_and_compiler(cache, monkeypatch, wrapper):
    base = cache_key(tiny())
    assert cache_key(tiny(offset=1)) != base                        # source
    assert cache_key(tiny(flags=("-O2",))) != base                   # flags
    assert cache_key(tiny(), extra_flags=("-g",)) != base
    assert cache_key(dataclasses.replace(tiny(), include_dirs=("/x",))) != base
    with monkeypatch.context() as m:
        m.setattr(cache_mod, "__version__", "999.0")                  # mlagen version
        assert cache_key(tiny()) != base
    assert cache_key(tiny()) == base
    monkeypatch.setenv("CXX", "g++")                                  # another compiler
    assert cache_key(tiny()) != base


def test_native_code_is_keyed_by_the_host_cpu(cache, monkeypatch):
    native = tiny(flags=("-O2", "-march=native"))
    k, portable = cache_key(native), cache_key(tiny())
    monkeypatch.setattr(cache_mod, "host_cpu", lambda: "another cpu")
    assert cache_key(native) != k
    assert cache_key(tiny()) == portable                # portable code: no CPU in the key


def test_key_follows_the_target_templates(cache, monkeypatch, tmp_path):
    """Headers under templates/<target>/ are part of every key of that target."""
    monkeypatch.setattr("mlagen.codegen.TEMPLATES_DIR", tmp_path / "templates")
    (tmp_path / "templates" / "buildtest").mkdir(parents=True)
    header = tmp_path / "templates" / "buildtest" / "algo.h"
    header.write_text("// v1\n")
    k1 = cache_key(tiny())
    header.write_text("// v2\n")
    assert cache_key(tiny()) != k1


# ------------------------------------------------------------------ processes ----------
_CHILD = textwrap.dedent("""\
    import json, os, sys, time
    sys.path.insert(0, {root!r})
    from pathlib import Path
    from mlagen.jit import build
    from mlagen.codegen import SourceSet
    from mlagen.runtime import load_library
    go = Path({go!r})
    (go.parent / ("ready." + str(os.getpid()))).touch()
    while not go.exists():          # start together
        time.sleep(0.005)
    ss = SourceSet(variant="buildtest_race", target="buildtest",
                   files={{"add.cpp": {src!r}}}, include_dirs=(), compiler="c++",
                   flags=("-O1",), sources=("add.cpp",))
    a = build(ss)
    print(json.dumps({{"built": a.built, "path": str(a.path), "seconds": a.seconds,
                      "sum": load_library(a.path).mlagen_test_add(40, 2)}}))
    """)


def _child(tmp_path: Path, go: Path, **popen) -> subprocess.Popen:
    code = _CHILD.format(root=str(ROOT), go=str(go), src=ADD % 0)
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **popen)


def test_four_processes_build_once_and_all_load(cache, wrapper, tmp_path, monkeypatch):
    monkeypatch.setenv("MLAGEN_TEST_SLEEP", "2")    # keep the first build in flight
    go = tmp_path / "go"
    kids = [_child(tmp_path, go) for _ in range(4)]
    deadline = time.time() + 120
    while len(list(tmp_path.glob("ready.*"))) < 4:  # all four imported and waiting
        assert all(k.poll() is None for k in kids) and time.time() < deadline
        time.sleep(0.01)
    go.touch()
    results = []
    for k in kids:
        out, err = k.communicate(timeout=120)
        assert k.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert wrapper() == 1, "exactly one process compiles"
    assert sorted(r["built"] for r in results) == [False, False, False, True]
    assert len({r["path"] for r in results}) == 1
    # they really raced: the other three waited on the lock for the compile (>= 2 s)
    assert all(r["seconds"] > 0.5 for r in results if not r["built"]), results
    assert all(r["sum"] == 42 for r in results)
    assert len(entries()) == 1


def test_killed_build_publishes_nothing(cache, wrapper, tmp_path, monkeypatch):
    monkeypatch.setenv("MLAGEN_TEST_SLEEP", "30")   # the compiler "runs" for 30 s
    go = tmp_path / "go"
    go.touch()
    kid = _child(tmp_path, go, start_new_session=True)
    try:
        deadline = time.time() + 60
        while wrapper() == 0:                       # wait until the compiler is running
            assert kid.poll() is None, kid.communicate()[1]
            assert time.time() < deadline, "the compiler never started"
            time.sleep(0.05)
        os.kill(kid.pid, signal.SIGKILL)            # the builder dies mid-compile
        kid.wait(timeout=30)
        assert kid.returncode == -signal.SIGKILL
        assert entries() == []
        litter = list((cache / "staging").iterdir())
        assert len(litter) == 1 and not (litter[0] / "kernel.so").exists()
        # the next build neither hangs on the dead builder's lock nor sees its litter
        monkeypatch.setenv("MLAGEN_TEST_SLEEP", "0")
        again = _child(tmp_path, go)
        out, err = again.communicate(timeout=120)
        assert again.returncode == 0, err
        r = json.loads(out.strip().splitlines()[-1])
        assert r["built"] and r["sum"] == 42
        assert [e.key for e in entries()] == [Path(r["path"]).parent.name]
    finally:
        # the dead builder's ninja (in the child's session) and the sleeping compiler
        # wrapper (ninja gives each command its own process group; the wrapper logged its id)
        groups = {kid.pid} | {os.getpgid(int(pid)) for pid in _pids(wrapper.counter)
                              if _alive(int(pid))}
        for group in groups:
            try:
                os.killpg(group, signal.SIGKILL)
            except ProcessLookupError:
                pass


# ------------------------------------------------------------------ errors -------------
BROKEN = 'extern "C" int mlagen_test_add(int a, int b) {\n  return a + undefined_name;\n}\n'


def test_failing_build_raises_build_error(cache):
    with pytest.raises(BuildError) as info:
        build(tiny(variant="buildtest_broken", text=BROKEN))
    e = info.value
    assert e.variant == "buildtest_broken"
    assert "add.cpp" in e.command and "-O1" in e.command and " -c " in e.command
    assert "error:" in e.first_error and "undefined_name" in e.first_error
    assert "add.cpp:2" in e.first_error
    log = Path(e.log_path)
    assert log.is_file() and "undefined_name" in log.read_text()
    assert log.parent.parent == cache / "staging"
    assert entries() == []
    text = str(e)
    for part in ("buildtest_broken", e.command, e.first_error, e.log_path):
        assert part in text
    # fixed source: builds fine after the failure (no lock or litter in the way)
    assert build(tiny(variant="buildtest_broken")).built


def test_missing_header_gets_a_hint(cache):
    src = '#include "no_such_header.h"\nextern "C" int f() { return 0; }\n'
    with pytest.raises(BuildError) as info:
        build(tiny(variant="buildtest_nohdr", text=src))
    assert "no_such_header.h" in info.value.first_error
    assert info.value.hint and "header is missing" in info.value.hint


def test_missing_compiler(cache, monkeypatch, tmp_path):
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    cache_mod.compiler_version.cache_clear()
    try:
        with pytest.raises(BuildError) as info:
            build(tiny(variant="buildtest_nocc"))
        assert Path(info.value.log_path).is_file()
        assert "no-such-compiler" in info.value.command
    finally:
        cache_mod.compiler_version.cache_clear()


def test_compile_only(cache, tmp_path):
    out = tmp_path / "objs"
    objs = compile_only(tiny(), out)
    assert [o.name for o in objs] == ["add.o"] and objs[0].stat().st_size > 0
    assert entries() == []                          # no cache involved
    with pytest.raises(BuildError) as info:
        compile_only(tiny(text=BROKEN), tmp_path / "broken")
    assert Path(info.value.log_path).is_file()
    with pytest.raises(BuildError) as info:
        compile_only(tiny(text=BROKEN))            # its own temporary folder
    assert Path(info.value.log_path).is_file()


# ------------------------------------------------------------------ list / clear -------
def test_entries_and_clear(cache):
    assert entries() == [] and clear() == 0
    a = build(tiny(variant="buildtest_one"))
    b = build(tiny(variant="buildtest_two"))
    es = entries()
    assert sorted(e.key for e in es) == sorted([a.key, b.key])
    for e in es:
        assert e.size >= a.path.stat().st_size > 0
        assert e.meta["variant"] in ("buildtest_one", "buildtest_two")
        assert abs(e.created - time.time()) < 600
    assert clear(older_than_s=3600) == 0 and len(entries()) == 2
    with pytest.raises(BuildError):
        build(tiny(variant="buildtest_bad", text=BROKEN))   # leaves staging litter
    assert clear() == 2
    assert entries() == [] and not (cache / "staging").exists()
    assert build(tiny(variant="buildtest_one")).built       # gone: builds again


def test_cli_cache_list_and_clear(cache, capsys):
    from mlagen.cli import main

    a = build(tiny(variant="buildtest_cli"))
    assert main(["cache", "list"]) == 0
    out = capsys.readouterr().out
    assert str(cache) in out and a.key in out and "1 builds" in out
    assert main(["cache", "clear"]) == 0
    assert "removed 1 builds" in capsys.readouterr().out
    assert entries() == []


def test_public_build_stays_a_function_after_the_jit_package_is_imported():
    """``mlagen.build(schedule)`` is the public API; importing ``mlagen.jit.*`` (as the
    backends do) must leave it a function."""
    code = ("import types, mlagen.jit.cache; from mlagen.jit import build as b; "
            "import mlagen; assert isinstance(mlagen.build, types.FunctionType), mlagen.build; "
            "assert b is not mlagen.build")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr


# ---------------------------------------------------------------- hints ----------------
from mlagen.jit.compile import _first_error, _hint  # noqa: E402

NVCC_MISSING = """\
[1/5] compile api.cu
FAILED: scheduler.o
nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -I/x/include -c scheduler.cu -o scheduler.o
/bin/sh: 1: nvcc: not found
[2/5] compile split.cu
FAILED: split.o
nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -I/x/include -c split.cu -o split.o
/bin/sh: 1: nvcc: not found
ninja: build stopped: subcommand failed.
"""
OLD_TOOLKIT = """\
FAILED: split.o
nvcc -gencode=arch=compute_90a,code=sm_90a -c split.cu -o split.o
nvcc fatal   : Unsupported gpu architecture 'compute_90a'
ninja: build stopped: subcommand failed.
"""
GCC_HEADER = """\
FAILED: kernel.o
c++ -O3 -Iruntime -c kernel.cpp -o kernel.o
kernel.cpp:3:10: fatal error: plan.h: No such file or directory
    3 | #include "plan.h"
compilation terminated.
ninja: build stopped: subcommand failed.
"""


@pytest.mark.parametrize("log,first,hint", [
    (NVCC_MISSING, "nvcc: not found", "nvcc is not on PATH"),
    (OLD_TOOLKIT, "nvcc fatal   : Unsupported gpu architecture 'compute_90a'", "too old"),
    (GCC_HEADER, "kernel.cpp:3:10: fatal error: plan.h: No such file or directory",
     "header is missing"),
])
def test_first_error_and_hint_match_the_real_failure(log, first, hint):
    assert _first_error(log) == first          # never ninja's "build stopped" summary
    assert hint in _hint(log)


def test_missing_compiler_says_not_found(cache, monkeypatch, tmp_path):
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    cache_mod.compiler_version.cache_clear()
    try:
        with pytest.raises(BuildError) as info:
            build(tiny(variant="buildtest_nocc2"))
        assert info.value.first_error.endswith("no-such-compiler: not found")
        assert "compiler is not there" in info.value.hint
    finally:
        cache_mod.compiler_version.cache_clear()


# ---------------------------------------------------------------- feedback -------------
def test_build_progress_names_the_compile_step(cache, wrapper, capsys):
    build(tiny(variant="buildtest_steps"), progress=True)
    err = capsys.readouterr().err
    assert "building buildtest_steps" in err
    assert "[1/2] cxx-wrapper.sh add.cpp" in err          # the compiler and the file
    build(tiny(variant="buildtest_quiet"))                 # a library call: quiet
    assert capsys.readouterr().err == ""


def test_lock_wait_names_the_holder(cache, wrapper, capsys):
    key = cache_key(tiny(variant="buildtest_held"))
    locks = cache / "locks"
    locks.mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""\
        import os, sys, time
        from filelock import FileLock
        lock = FileLock({str(locks / (key + '.lock'))!r}); lock.acquire()
        open({str(locks / (key + '.pid'))!r}, "w").write(str(os.getpid()))
        print("held", flush=True); time.sleep(2); lock.release()
        """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        a = build(tiny(variant="buildtest_held"), progress=True)
    finally:
        holder.wait(timeout=60)
    assert a.built                                         # the holder built nothing
    err = capsys.readouterr().err
    assert f"waiting for buildtest_held: pid {holder.pid} is building it" in err
    assert not (locks / f"{key}.pid").exists()             # our own pid file is gone


# ---------------------------------------------------------------- damaged entries ------
def _damage(lib: Path, how: str) -> None:
    data = lib.read_bytes()
    if how == "truncate":          # a disk that filled up mid-copy, a killed rsync
        lib.write_bytes(data[:1000])
    elif how == "empty":
        lib.write_bytes(b"")
    else:                          # "garble": same size, other bytes
        lib.write_bytes(data[:64] + bytes(b ^ 0x5A for b in data[64:]))


_LOADER = textwrap.dedent("""\
    import json, sys
    sys.path.insert(0, {root!r})
    from mlagen.codegen import SourceSet
    from mlagen.jit import load
    ss = SourceSet(variant={variant!r}, target="buildtest", files={{"add.cpp": {src!r}}},
                   include_dirs=(), compiler="c++", flags=("-O1",), sources=("add.cpp",))
    a, lib = load(ss)
    print(json.dumps({{"built": a.built, "sum": lib.mlagen_test_add(40, 2)}}))
    """)


def _load_in_child(variant: str) -> subprocess.CompletedProcess:
    """A fresh process (a bus error must not take pytest down) that builds and loads."""
    code = _LOADER.format(root=str(ROOT), variant=variant, src=ADD % 0)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ))


@pytest.mark.parametrize("how", ["truncate", "empty", "garble"])
def test_a_damaged_library_is_named_removed_and_rebuilt(cache, wrapper, how):
    first = build(tiny(variant=f"buildtest_{how}"))
    meta = json.loads((first.directory / "meta.json").read_text())
    assert meta["library"]["size"] == first.path.stat().st_size > 1000
    assert len(meta["library"]["sha256"]) == 64
    _damage(first.path, how)
    [e] = entries()
    assert e.damaged and "kernel.so" in e.damaged
    proc = _load_in_child(f"buildtest_{how}")
    assert proc.returncode == 0, (proc.returncode, proc.stderr)
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r == {"built": True, "sum": 42}
    assert f"cache entry {first.directory} is damaged" in proc.stderr
    assert "rebuilding" in proc.stderr and "Traceback" not in proc.stderr
    assert wrapper() == 2
    [e] = entries()
    assert e.damaged is None                               # the rebuilt entry is whole
    again = build(tiny(variant=f"buildtest_{how}"))
    assert not again.built and _call(again.path) == 5


def test_a_damaged_library_is_refused_before_dlopen(cache):
    a = build(tiny(variant="buildtest_refused"))
    _damage(a.path, "truncate")
    from mlagen.jit import CacheError

    with pytest.raises(CacheError, match=f"cache entry {a.directory} is damaged .*1000 bytes"):
        load_library(a.path)


def test_build_never_calls_a_damaged_entry_cached(cache, capsys):
    from mlagen.cli import main

    assert main(["build", str(ROOT / "schedules" / "sc11_attn.toml")]) == 0
    assert ": built in" in capsys.readouterr().out
    [e] = entries()
    _damage(e.directory / "kernel.so", "truncate")
    assert main(["cache", "list"]) == 0
    out = capsys.readouterr().out
    assert "damaged: kernel.so is 1000 bytes" in out and "1 damaged builds" in out
    assert main(["build", str(ROOT / "schedules" / "sc11_attn.toml")]) == 0
    out, err = capsys.readouterr()
    assert ": built in" in out and "cached" not in out
    assert f"cache entry {e.directory} is damaged" in err
    assert main(["build", str(ROOT / "schedules" / "sc11_attn.toml")]) == 0
    assert ": cached in" in capsys.readouterr().out


def test_an_entry_that_does_not_load_is_rebuilt_once(cache, wrapper):
    """A library that matches its record but is no shared object (a foreign entry):
    dlopen fails, the entry is named, removed and built again."""
    from mlagen.jit import load
    from mlagen.jit.integrity import fingerprint

    a = build(tiny(variant="buildtest_foreign"))
    a.path.write_bytes(b"\x7fELF not really" * 100)
    meta = json.loads((a.directory / "meta.json").read_text())
    meta["library"] = fingerprint(a.path)
    (a.directory / "meta.json").write_text(json.dumps(meta))
    art, lib = load(tiny(variant="buildtest_foreign"))
    assert art.built and lib.mlagen_test_add(2, 3) == 5 and wrapper() == 2


def test_half_written_staging_and_half_copied_entries_are_not_builds(cache, wrapper):
    ss = tiny(variant="buildtest_half")
    key = cache_key(ss)
    good = build(ss)
    data = good.path.read_bytes()
    clear()
    # a builder killed while linking: its staging folder holds a short library
    half = cache / "staging" / f"{key}.999999.deadbeef"
    half.mkdir(parents=True)
    (half / "kernel.so").write_bytes(data[: len(data) // 2])
    # a copy of the cache killed part-way: the entry's library is there, its meta.json not
    entry = cache / "builds" / key
    entry.mkdir(parents=True)
    (entry / "kernel.so").write_bytes(data[: len(data) // 2])
    [e] = entries()
    assert "meta.json" in e.damaged
    proc = _load_in_child("buildtest_half")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"built": True, "sum": 42}
    assert f"cache entry {entry} is damaged" in proc.stderr
    assert [e.damaged for e in entries()] == [None]


def test_ctrl_c_in_a_build_exits_130_and_leaves_the_cache_as_it_was(cache, wrapper):
    """A terminal's Ctrl-C (SIGINT to the whole foreground group) mid-compile: "interrupted",
    exit 130, no build, no staging litter and no .failed tree."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), MLAGEN_TEST_SLEEP="30")
    kid = subprocess.Popen([sys.executable, "-m", "mlagen.cli", "build",
                            str(ROOT / "schedules" / "sc11_attn.toml")],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                           start_new_session=True)
    try:
        deadline = time.time() + 120
        while wrapper() == 0:
            assert kid.poll() is None, kid.communicate()
            assert time.time() < deadline, "the compiler never started"
            time.sleep(0.05)
        os.killpg(kid.pid, signal.SIGINT)
        out, err = kid.communicate(timeout=60)
    finally:
        for pid in [kid.pid] + [int(p) for p in _pids(wrapper.counter)]:
            if _alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(os.getpgid(pid), signal.SIGKILL)
    assert kid.returncode == 130, (kid.returncode, err)
    assert err.strip().splitlines()[-1] == "mlagen: interrupted", err
    assert "build of" not in err and "Traceback" not in err
    assert entries() == []
    assert not (cache / "staging").exists() or list((cache / "staging").iterdir()) == []
