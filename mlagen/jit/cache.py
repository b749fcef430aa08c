"""Cache keys, cache directories and their listing."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from ..codegen import SourceSet, template_digest
from ..paths import cache_dir
from ..version import __version__
from .integrity import entry_damage

LIB_NAME = "kernel.so"


@dataclass(frozen=True)
class Artifact:
    key: str
    path: Path          # the shared library
    directory: Path
    built: bool         # True when this call compiled it, False when it came from the cache
    seconds: float      # build (or lookup) time


@dataclass(frozen=True)
class CacheEntry:
    key: str
    directory: Path
    size: int
    created: float
    meta: dict
    damaged: str | None = None   # why its library cannot be loaded (None: intact)


def compiler_path(compiler: str) -> str:
    """The compiler a SourceSet's ``compiler`` ("c++" or "nvcc") runs as: $CXX for C++;
    $CUDA_HOME/bin/nvcc (or $CUDA_PATH, or PATH) for nvcc."""
    if compiler == "nvcc":
        home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
        if home and (Path(home) / "bin" / "nvcc").exists():
            return str(Path(home) / "bin" / "nvcc")
        return shutil.which("nvcc") or "nvcc"
    return os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or "c++"


@functools.lru_cache(maxsize=None)
def compiler_version(compiler: str) -> str:
    """``compiler --version`` (once per process and compiler path)."""
    try:
        out = subprocess.run([compiler, "--version"], capture_output=True, text=True,
                             timeout=30)
        return out.stdout.strip() or out.stderr.strip()
    except (OSError, subprocess.TimeoutExpired):
        return f"{compiler}: not found"


@functools.lru_cache(maxsize=None)
def host_cpu() -> str:
    """The CPU model and feature flags: code built with -march=native runs only on such a
    CPU, so a cache shared between machines must not hand it to another."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return f"{platform.machine()} {platform.processor()}"
    keep = [ln for ln in lines if ln.split(":")[0].strip() in ("model name", "flags",
                                                               "Features", "CPU part")]
    return "\n".join(dict.fromkeys(keep)) or platform.machine()


@functools.lru_cache(maxsize=None)
def torch_version() -> str:
    import importlib.metadata   # ~30 ms: only when a key is computed

    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return "none"


def cache_key(sources: SourceSet, extra_flags: tuple[str, ...] = ()) -> str:
    """``<variant>-<16 hex>``: the readable variant name, then a hash of everything that
    changes the binary: rendered files, the target's templates and headers, which files are
    compiled, include folders, flags, the compiler actually run and its version, torch's
    version and mlagen's version; with ``-march=native`` also the host CPU's model and
    feature flags."""
    cc = compiler_path(sources.compiler)
    h = hashlib.sha256()
    for part in (sources.digest(), template_digest(sources.target),
                 " ".join(sources.sources), " ".join(sources.include_dirs),
                 " ".join(sources.flags + extra_flags), cc, compiler_version(cc),
                 torch_version(), __version__):
        h.update(part.encode() + b"\0")
    if any("native" in f for f in sources.flags + extra_flags):
        h.update(host_cpu().encode())
    return f"{sources.variant}-{h.hexdigest()[:16]}"


def builds_dir() -> Path:
    return cache_dir() / "builds"


def staging_dir() -> Path:
    return cache_dir() / "staging"


def locks_dir() -> Path:
    return cache_dir() / "locks"


def _size(p: Path) -> int:
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


def entries() -> list[CacheEntry]:
    out = []
    root = builds_dir()
    if not root.is_dir():
        return out
    for d in sorted(root.iterdir()):
        meta_file = d / "meta.json"
        try:
            meta = json.loads(meta_file.read_text())
        except (OSError, ValueError):
            meta = {}
        if not isinstance(meta, dict):
            meta = {}
        out.append(CacheEntry(d.name, d, _size(d), meta.get("created", d.stat().st_mtime), meta,
                              entry_damage(d, LIB_NAME)))
    return out


def clear(older_than_s: float | None = None) -> int:
    """Remove published builds (and staging litter); returns how many builds went."""
    n = 0
    now = time.time()
    for e in entries():
        if older_than_s is None or now - e.created > older_than_s:
            shutil.rmtree(e.directory, ignore_errors=True)
            n += 1
    if older_than_s is None:
        shutil.rmtree(staging_dir(), ignore_errors=True)
    return n
