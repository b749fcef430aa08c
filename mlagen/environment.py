"""The environment variables mlagen reads, each checked up front (the CLI checks them all
before a command starts): a malformed value is one line naming the variable, never a
traceback or a failure far away (a compiler's, a cache listing's "0 builds").

    MLAGEN_CACHE_DIR, XDG_CACHE_HOME   the build cache's folder (paths.cache_dir)
    MLAGEN_BUILD_JOBS                  ninja's -j for a build (jit.compile)
    CXX, CUDA_HOME, CUDA_PATH          the compilers (jit.cache.compiler_path)
    MLAGEN_VERIFY_PROFILE              `verify`'s default profile (verify.profiles)
    MLAGEN_COMMIT                      the commit a benchmark's results name
    RANK, WORLD_SIZE, LOCAL_RANK       a torchrun process group (parallel.init_from_env,
                                       checked there: `run --tp` sets them for its ranks)
    a target's own                     its backend's check_environment()
"""

from __future__ import annotations

import os
import shutil

from .envvars import (EnvironmentVariableError, expand_path, folder, shown,
                      whole_number)


def _program(var: str) -> None:
    value = os.environ.get(var)
    if value is None:
        return
    if not value.strip():
        raise EnvironmentVariableError(var, "is set but empty (unset it, or name a compiler)")
    exe = expand_path(var, value.split()[0])
    if shutil.which(str(exe)) is None:
        raise EnvironmentVariableError(var, f"{shown(value)}: no such program")


def _toolkit(var: str) -> None:
    value = os.environ.get(var)
    if not value:
        return
    p = expand_path(var, value)
    if not p.is_dir():
        raise EnvironmentVariableError(var, f"{shown(value)} is not a folder (the CUDA "
                                            "toolkit's, holding bin/nvcc)")


def _line(var: str) -> None:
    value = os.environ.get(var)
    if value is not None and ("\n" in value or len(value) > 200):
        raise EnvironmentVariableError(var, f"{shown(value)} must be one short line")



def check_core() -> None:
    """The variables the core reads."""
    from .paths import cache_dir

    folder("XDG_CACHE_HOME")
    folder("MLAGEN_CACHE_DIR")
    cache_dir()                                  # and the folder they lead to
    whole_number("MLAGEN_BUILD_JOBS")
    _program("CXX")
    _toolkit("CUDA_HOME")
    _toolkit("CUDA_PATH")
    _line("MLAGEN_COMMIT")
    profile = os.environ.get("MLAGEN_VERIFY_PROFILE")
    if profile:
        from .verify.profiles import PROFILES

        if profile not in PROFILES:
            raise EnvironmentVariableError("MLAGEN_VERIFY_PROFILE",
                                           f"{shown(profile)} must be one of "
                                           + ", ".join(PROFILES))


def check_all() -> None:
    """Every variable mlagen reads, the targets' own included (the CLI's first step)."""
    from .backends import all_backends

    check_core()
    for b in all_backends():
        b.check_environment()
