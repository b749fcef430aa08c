"""Compiler invocation through ninja, inside a per-key lock, published atomically."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Callable, Iterator, Optional

from ninja.ninja_syntax import Writer

from .. import console

from ..codegen import SourceSet, write
from ..envvars import whole_number
from ..errors import BuildError
from . import patches
from .cache import (LIB_NAME, Artifact, builds_dir, cache_key, compiler_path,
                    compiler_version, locks_dir, staging_dir, torch_version)
from .integrity import CacheError, entry_damage, fingerprint, quarantine

_ERROR_LINE = re.compile(r"(error|Error|fatal error)\b.*")

# Matched against the first failed step's own output (not the whole log, whose command
# lines name sm_90a and every include folder), in this order.
HINTS = [
    (re.compile(r"^(/bin/sh: \d+: )?(\S*/)?nvcc: (command )?not found$", re.M),
     "nvcc is not on PATH: install the CUDA toolkit (12.3 or newer) or set CUDA_HOME"),
    (re.compile(r"^(/bin/sh: \d+: )?\S+: (command )?not found$", re.M),
     "the compiler is not there: set CXX (C++) or CUDA_HOME (nvcc), or fix PATH"),
    (re.compile(r"No such file or directory|cannot open source file"),
     "a header is missing: check the include folders and that the templates are installed"),
    (re.compile(r"out of memory|Killed|virtual memory exhausted"),
     "the compiler ran out of memory: build fewer variants at once (MLAGEN_BUILD_JOBS=1)"),
    (re.compile(r"Unsupported gpu architecture|[Vv]alue 'sm_90a' is not defined|"
                r"compute_90a.*(not supported|unsupported)"),
     "the CUDA toolkit is too old for sm_90a: CUDA 12.3 or newer is needed"),
]
_STEP = re.compile(r"^(\[\d+/\d+\] |FAILED: |ninja: )")
_NINJA_STEP = re.compile(r"^\[(\d+)/(\d+)\] (.*)")


def _commands(sources: SourceSet, out_dir: Path, shared: bool) -> tuple[str, list[str]]:
    """The ninja file (written by ninja's own ninja_syntax.Writer, which escapes paths) and
    the human-readable compile commands of a SourceSet."""
    cc = compiler_path(sources.compiler)
    incs = " ".join(f"-I{shlex.quote(d)}" for d in (str(out_dir),) + sources.include_dirs)
    flags = " ".join(sources.flags)
    pic = "-Xcompiler -fPIC" if sources.compiler == "nvcc" else "-fPIC"
    deps = sources.compiler != "nvcc"              # gcc-style dependency files
    buf = io.StringIO()
    w = Writer(buf, width=10_000)                   # one line per statement: readable logs
    w.variable("cc", cc)
    w.rule("compile", f"$cc {flags} {pic} {incs}" + (" -MD -MF $out.d" if deps else "")
           + " -c $in -o $out", description=f"{Path(cc).name} $in",
           depfile="$out.d" if deps else None, deps="gcc" if deps else None)
    w.rule("link", f"$cc {flags} {pic} -shared $in -o $out", description="link $out")
    objs, shown = [], []
    for src in sources.sources:
        obj = Path(src).with_suffix(".o").name
        objs.append(obj)
        w.build(obj, "compile", src)
        shown.append(f"{cc} {flags} {pic} {incs} -c {src} -o {obj}")
    if shared:
        w.build(LIB_NAME, "link", objs)
        w.default(LIB_NAME)
        shown.append(f"{cc} {flags} {pic} -shared {' '.join(objs)} -o {LIB_NAME}")
    else:
        w.default(objs)
    return buf.getvalue(), shown


def _failed_output(log: str) -> str:
    """What the first failed step printed: the lines after ninja's ``FAILED:`` line and
    the command under it, up to ninja's next line.  Empty when no step failed (ninja
    itself failed, e.g. a bad build file)."""
    lines = log.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("FAILED:"):
            out = []
            for nxt in lines[i + 2:]:
                if _STEP.match(nxt):
                    break
                out.append(nxt)
            return "\n".join(out)
    return ""


def _first_error(log: str) -> str:
    """The first failed step's first ``error`` line (gcc, clang and nvcc all write one),
    else its first line (``/bin/sh: 1: nvcc: not found``), else ninja's own complaint."""
    own = _failed_output(log)
    for text in (own, log):
        for line in text.splitlines():
            if "error:" in line or line.lstrip().startswith("error"):
                return line.strip()
        for line in text.splitlines():
            if _ERROR_LINE.search(line) and not _STEP.match(line):
                return line.strip()
    for line in own.splitlines():
        if line.strip():
            return re.sub(r"^/bin/sh: \d+: ", "", line.strip())
    return (log.strip().splitlines() or ["(no output)"])[-1]


def _failed_command(log: str) -> str | None:
    """The command ninja ran for the first failed edge: the line after ``FAILED: ...``."""
    lines = log.splitlines()
    for i, line in enumerate(lines[:-1]):
        if line.startswith("FAILED:"):
            return lines[i + 1].strip()
    return None


def _hint(log: str) -> str | None:
    text = _failed_output(log) or log
    for pattern, hint in HINTS:
        if pattern.search(text):
            return hint
    return None


def _run_ninja(sources: SourceSet, work: Path, shared: bool, move_failed: bool,
               step: Optional[Callable[[str], None]] = None) -> None:
    """Write the sources and a build.ninja into ``work`` and run ninja there.  On failure
    raise BuildError; with ``move_failed`` the tree is first renamed to ``<work>.failed``
    so the log survives the clean-up of ``work``."""
    write(sources, work)
    ninja_file, shown = _commands(sources, work, shared)
    (work / "build.ninja").write_text(ninja_file)
    jobs = whole_number("MLAGEN_BUILD_JOBS")     # "lots": refused here, not by ninja
    cmd = ["ninja", "-C", str(work)] + (["-j", str(jobs)] if jobs else [])
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, errors="replace")
    except FileNotFoundError:
        raise BuildError(sources.variant, " ".join(cmd), "ninja: not found", str(work),
                         "pip install ninja (a dependency of mlagen)") from None
    lines = []
    try:
        for line in proc.stdout:        # "[2/5] nvcc split.cu": the step now running
            lines.append(line)
            m = _NINJA_STEP.match(line)
            if m and step is not None:
                step(f"[{m.group(1)}/{m.group(2)}] {m.group(3).strip()}")
        proc.wait()
    except KeyboardInterrupt:           # stop ninja too (a terminal's Ctrl-C reaches it
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):   # already)
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=10)
        raise
    log = "".join(lines)
    if proc.returncode in (-signal.SIGINT, 130) or "interrupted by user" in log:
        # Ctrl-C reached ninja (or the compiler) first: an interruption, not a failure
        raise KeyboardInterrupt
    (work / "build.log").write_text("\n".join(shown) + "\n\n" + log)
    if proc.returncode != 0:
        failed = work
        if move_failed:   # keep the failed tree for the user; its log is where we say
            failed = work.parent / (work.name + ".failed")
            shutil.rmtree(failed, ignore_errors=True)
            os.replace(work, failed)
        command = _failed_command(log) or (shown[0] if shown else " ".join(cmd))
        raise BuildError(sources.variant, command,
                         _first_error(log), str(failed / "build.log"), _hint(log))


def _holder(pid_file: Path) -> str:
    try:
        pid = pid_file.read_text().strip()
    except OSError:
        return "another process"
    return f"pid {pid}" if pid.isdigit() else "another process"


@contextlib.contextmanager
def _key_lock(key: str, variant: str, progress: bool) -> Iterator[None]:
    """The key's lock; while another process holds it, say who (its pid) and wait."""
    from filelock import FileLock, Timeout   # only a build takes the lock

    path = locks_dir() / f"{key}.lock"
    pid_file = locks_dir() / f"{key}.pid"
    lock = FileLock(str(path))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        who = _holder(pid_file)
        with console.status(f"mlagen: waiting for {variant}: {who} is building it "
                            f"(lock {path})", progress):
            lock.acquire()
    try:
        pid_file.write_text(str(os.getpid()))
        yield
    finally:
        with contextlib.suppress(OSError):
            pid_file.unlink()
        lock.release()


def provenance(origin) -> dict:
    """Where a build was asked for (not part of its key): the schedule's name and file."""
    if origin is None:
        return {}
    return {"schedule": getattr(origin, "name", str(origin)),
            "source": getattr(origin, "source", None)}


def _intact(final: Path) -> bool:
    return (final / LIB_NAME).exists() and entry_damage(final, LIB_NAME) is None


def _warn(line: str) -> None:
    # always said, progress or not: a rebuild takes seconds to minutes, and the user's
    # disk or copy may be at fault
    print(line, file=sys.stderr, flush=True)


def build(sources: SourceSet, progress: Optional[bool] = None, origin=None) -> Artifact:
    """The shared library of a SourceSet, compiled once per key across processes.
    ``origin`` (the schedule it was rendered from) goes into meta.json only: the key
    depends on what the compiler sees, so identical kernels share one build.

    A published entry whose library no longer matches the size and sha256 recorded at
    publication (truncated, emptied, garbled, or copied without its meta.json) is never
    handed out: it is named on stderr, removed and rebuilt.

    progress: say what a wait is for (the compile step running, the pid holding the lock)
    on stderr; default: when the CLI asked for it (mlagen.console.PROGRESS)."""
    progress = console.PROGRESS if progress is None else progress
    t0 = time.perf_counter()
    sources = patches.apply(sources)      # the verifier's planted source patches, if any
    key = cache_key(sources)
    final = builds_dir() / key
    lib = final / LIB_NAME
    if _intact(final):   # the common, warm path: no lock needed, publication is atomic
        return Artifact(key, lib, final, False, time.perf_counter() - t0)
    locks_dir().mkdir(parents=True, exist_ok=True)
    with _key_lock(key, sources.variant, progress):
        if _intact(final):   # another process built (or repaired) it while we waited
            return Artifact(key, lib, final, False, time.perf_counter() - t0)
        if final.exists():
            why = entry_damage(final, LIB_NAME) if lib.exists() else f"{LIB_NAME} is missing"
            _warn(f"mlagen: cache entry {final} is damaged ({why}); removed, rebuilding")
            quarantine(final, staging_dir())
        staging_dir().mkdir(parents=True, exist_ok=True)
        work = staging_dir() / f"{key}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
        work.mkdir(parents=True)
        what = f"mlagen: building {sources.variant}"
        try:
            with console.status(f"{what} ...", progress) as st:
                _run_ninja(sources, work, shared=True, move_failed=True,
                           step=lambda text: st.update(f"{what}: {text}"))
        except KeyboardInterrupt:
            # Ctrl-C: the cache stays as it was (no staging litter, no .failed tree)
            shutil.rmtree(work, ignore_errors=True)
            shutil.rmtree(work.parent / (work.name + ".failed"), ignore_errors=True)
            raise
        (work / "meta.json").write_text(json.dumps({
            "variant": sources.variant, "target": sources.target, "created": time.time(),
            "compiler": (compiler_version(compiler_path(sources.compiler)).splitlines()
                         or ["?"])[0],
            "torch": torch_version(), "flags": list(sources.flags), "meta": sources.meta,
            "built_for": provenance(origin),
            "library": fingerprint(work / LIB_NAME),   # checked before every load
        }, indent=1, default=str))
        final.parent.mkdir(parents=True, exist_ok=True)
        if final.exists():       # appeared meanwhile without the lock (copied in by hand)
            quarantine(final, staging_dir())
        os.rename(work, final)   # atomic publish: readers see nothing or everything
    return Artifact(key, lib, final, True, time.perf_counter() - t0)


def load(sources: SourceSet, progress: Optional[bool] = None, origin=None
         ) -> tuple[Artifact, object]:
    """``build`` then dlopen the library.  A library that passes its checksum but still
    fails to load (a foreign entry, a changed system library) is named, removed and built
    once more; a second failure is a CacheError that says to clear the cache."""
    from ..runtime import load_library

    art = build(sources, progress=progress, origin=origin)
    try:
        return art, load_library(art.path)
    except (OSError, CacheError) as e:     # damaged after build()'s check, or not loadable
        _warn(f"mlagen: cache entry {art.directory} does not load ({_short(e)}); "
              "removed, rebuilding")
        quarantine(art.directory, staging_dir())
    art = build(sources, progress=progress, origin=origin)
    try:
        return art, load_library(art.path)
    except (OSError, CacheError) as e:
        raise CacheError(f"{art.path} does not load after a rebuild ({_short(e)}); run "
                         "`mlagen cache clear` and check the disk and the compiler") from None


def _short(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:200] if text else type(e).__name__


def compile_only(sources: SourceSet, out_dir: str | Path | None = None) -> list[Path]:
    """Compile every source to an object file (no link, no cache): CI's check that a
    template compiles where the target's hardware is absent (nvcc on a CPU machine).

    Without ``out_dir`` the objects go to a temporary folder that is removed again (the
    returned paths are then only names); a failed build keeps ``<folder>.failed`` for its
    log, which the BuildError names."""
    sources = patches.apply(sources)
    own = out_dir is None
    work = Path(tempfile.mkdtemp(prefix="mlagen-cc-")) if own else Path(out_dir)
    work.mkdir(parents=True, exist_ok=True)
    try:
        _run_ninja(sources, work, shared=False, move_failed=own)
        return [work / Path(s).with_suffix(".o").name for s in sources.sources]
    finally:
        if own:
            shutil.rmtree(work, ignore_errors=True)   # a failed tree stays for its log
