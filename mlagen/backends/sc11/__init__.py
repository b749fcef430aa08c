"""The SC11 backend: render a schedule into an emulator kernel, build it, run it.

    render(schedule)  -> SourceSet   templates/sc11/kernel.cpp.j2 + the runtime headers
                                     (sources.py)
    runner(schedule)  -> Sc11Runner  callable: MlaInputs -> MlaOutputs (+ trace, scheme,
                                     LMEM / L2 high-water marks in ``extra``) (emulator.py)

The kernel library has a plain C ABI (templates/sc11/runtime/abi.h): one call runs the
whole operator on the emulated chip, in compute mode (real data) or dry mode (same control
flow and trace, no data work; what the scheme chooser simulates).

emulator.py imports torch and numpy, so its names are loaded on first use (PEP 562): the
backend registry imports this package for `mlagen check` and `generate` too.
"""

from __future__ import annotations

import importlib

from .sources import DTYPE_CLASSES, FAULT_ENUMS, FLAGS, RUNTIME_DIR, render

__all__ = ["render", "runner", "Sc11Runner", "SCHEME_IDS", "FLAGS", "RUNTIME_DIR",
           "FAULT_ENUMS", "DTYPE_CLASSES"]


# what emulator.py provides; any other name is a submodule (``from . import rules``
# asks this hook first, and must not pull torch in)
_EMULATOR = ("runner", "Sc11Runner", "SCHEME_IDS")


def __getattr__(name: str):
    if name not in _EMULATOR:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.emulator"), name)
