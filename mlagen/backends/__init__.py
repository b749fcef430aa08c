"""One backend module per target kind.  Each provides:

    render(schedule) -> SourceSet          the kernel sources of a checked schedule
    runner(schedule) -> Runner             build (cached), load, and a callable that runs
                                           the kernel on an MlaInputs (mlagen.problem)
    device_problem() -> str | None         (optional) why this machine cannot run its
                                           kernels, e.g. "needs an NVIDIA sm_90 GPU"

Adding a target is a description in targets/, templates in templates/<kind>/, and one
module here registered in KINDS.
"""

from __future__ import annotations

import importlib
from types import ModuleType

KINDS = {"sc11": "mlagen.backends.sc11", "hopper": "mlagen.backends.hopper"}


def backend(kind: str) -> ModuleType:
    return importlib.import_module(KINDS[kind])


def backend_for(schedule) -> ModuleType:
    return backend(schedule.target.name)


def require_device(schedule) -> None:
    """Raise MlagenError (one line, exit 2 from the CLI) when this machine cannot run the
    schedule's kernel, before anything is built, drawn or saved."""
    from ..errors import MlagenError

    check = getattr(backend_for(schedule), "device_problem", None)
    problem = check() if check else None
    if problem:
        raise MlagenError(f"target {schedule.target.name} {problem}; `mlagen check`, "
                          f"`generate` and `build` work without one")
