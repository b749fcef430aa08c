"""One backend module per target kind.  Each provides:

    render(schedule) -> SourceSet          the kernel sources of a checked schedule
    runner(schedule) -> Runner             build (cached), load, and a callable that runs
                                           the kernel on an MlaInputs (mlagen.problem)

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
