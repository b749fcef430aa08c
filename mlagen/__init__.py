"""mlagen: a code-generation compiler for MLA decode kernels.

The public API (the CLI and the tests call the same functions):

    load_schedule(path) -> Schedule       parse and check a schedule file
    generate(schedule, out_dir)           render its kernel sources
    build(schedule) -> Artifact           compile (cached, locked) its kernel library
    run(schedule, inputs) -> MlaOutputs   run it on an MlaInputs (mlagen.problem)
"""

from __future__ import annotations

from pathlib import Path

from .errors import (BuildError, EmulatorError, InputError, MlagenError, ResourceError,
                     ScheduleError, TargetError)
from .schedule import Plan, Schedule, can_implement, check, plan_of
from .schedule import load as load_schedule
from .version import __version__

__all__ = ["__version__", "Schedule", "Plan", "plan_of", "load_schedule", "check", "can_implement", "render",
           "generate", "build", "runner", "run", "MlagenError", "ScheduleError",
           "ResourceError", "TargetError", "BuildError", "InputError", "EmulatorError",
           "get_mla_metadata", "flash_mla_with_kvcache"]


def __getattr__(name: str):
    # A backend's public calls (e.g. the FlashMLA-compatible ones), imported on first use
    # (they register torch ops).
    from .backends import all_backends

    for b in all_backends():
        if name in getattr(b, "api_names", ()):
            return b.api(name)
    raise AttributeError(f"module 'mlagen' has no attribute {name!r}")


def render(schedule: Schedule):
    """The kernel sources of a checked schedule: a ``mlagen.codegen.SourceSet`` (rendered
    files, include folders, compiler and flags), from its target's backend."""
    from .codegen import render as _render

    return _render(schedule)


def generate(schedule: Schedule, out_dir: str | Path, headers: bool = True) -> list[Path]:
    """Render the schedule's sources into out_dir (as `mlagen generate` does) and return
    the paths written.  With ``headers`` the headers they include are copied beside them
    under out_dir/include/, so the folder compiles on its own (see ``compile_command``)."""
    from .codegen import copy_headers, write

    sources = render(schedule)
    written = write(sources, out_dir)
    if headers:
        written += copy_headers(sources, Path(out_dir) / "include")
    return written


def build(schedule: Schedule, progress: bool | None = None):
    """Compile the schedule's kernel library, once per cache key across processes (see
    mlagen.jit), and return its ``Artifact`` (``.path`` the shared library, ``.built``
    False when it came from the cache).  Raises BuildError with the compiler's first error.
    progress: say on stderr what a wait is for (default: only under the CLI)."""
    # imported here: `mlagen check` and `--help` start without the builder (fast start-up);
    # it lives in mlagen.jit, so ``mlagen.build`` is only ever this function
    from .jit import build as _build_sources

    plan = plan_of(schedule)
    return _build_sources(render(plan), progress=progress, origin=plan.schedule)


def runner(schedule: Schedule):
    """The schedule's kernel, built (cached) and loaded: a callable ``MlaInputs ->
    MlaOutputs`` to reuse over many calls.  A backend's runner may take more keywords
    (an emulator's ``scheme=``) and put more in ``outputs.extra`` (its trace)."""
    plan = plan_of(schedule)
    return plan.backend.runner(plan)


def run(schedule: Schedule, inputs):
    """Run the schedule's kernel once on ``inputs`` (an ``mlagen.problem.MlaInputs``: q,
    paged k_cache, block_table, cache_seqlens, softmax_scale) and return ``MlaOutputs``
    (``.out`` [batch, s_q, heads, dv] in q's dtype, ``.lse`` fp32 [batch, heads, s_q]).

    Builds on first use (cached).  Bad tensors raise InputError before the kernel runs; a
    GPU target needs its GPU and tensors on it.  Example: README, "Python API"."""
    return runner(schedule)(inputs)
