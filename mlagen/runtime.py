"""Loading built artifacts.  Kernels expose a plain C ABI (pointers, sizes, a stream), so
no kernel includes torch's headers and a build takes seconds, not a minute."""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path

_LOCK = threading.Lock()
_LIBS: dict[str, ctypes.CDLL] = {}


def load_library(path: str | Path) -> ctypes.CDLL:
    """dlopen a built kernel library once per process."""
    key = str(Path(path).resolve())
    with _LOCK:
        lib = _LIBS.get(key)
        if lib is None:
            lib = ctypes.CDLL(key)
            _LIBS[key] = lib
        return lib


def ptr(t) -> ctypes.c_void_p:
    """A tensor's data pointer for a C call (None for an absent optional tensor)."""
    return ctypes.c_void_p(t.data_ptr() if t is not None else 0)
