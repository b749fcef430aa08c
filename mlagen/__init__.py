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

# The JIT builder lives in mlagen.jit, so ``mlagen.build`` is only ever this function.
from .jit import build as _build_sources  # noqa: E402

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
    """The kernel sources (a SourceSet) of a schedule or its checked Plan."""
    from .codegen import render as _render

    return _render(schedule)


def generate(schedule: Schedule, out_dir: str | Path) -> list[Path]:
    """Render the schedule's sources into out_dir (as `mlagen generate` does)."""
    from .codegen import write

    return write(render(schedule), out_dir)


def build(schedule: Schedule, progress: bool = False):
    """The schedule's kernel library, compiled once per cache key (see mlagen.jit)."""
    plan = plan_of(schedule)
    return _build_sources(render(plan), progress=progress, origin=plan.schedule)


def runner(schedule: Schedule):
    """A callable MlaInputs -> MlaOutputs running the schedule's kernel (built on demand)."""
    plan = plan_of(schedule)
    return plan.backend.runner(plan)


def run(schedule: Schedule, inputs):
    return runner(schedule)(inputs)
