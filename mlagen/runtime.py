"""Loading built artifacts.  Kernels expose a plain C ABI (pointers, sizes, a stream), so
no kernel includes torch's headers and a build takes seconds, not a minute."""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path

from .jit.integrity import CacheError, damage, read_meta

_LOCK = threading.Lock()
_LIBS: dict[str, ctypes.CDLL] = {}


def load_library(path: str | Path) -> ctypes.CDLL:
    """dlopen a built kernel library once per process.  A library published by the build
    cache (a meta.json beside it) is first checked against the size and sha256 recorded
    there: a damaged one raises CacheError naming its entry instead of being mapped (a
    truncated ELF file can kill the process with a bus error)."""
    key = str(Path(path).resolve())
    with _LOCK:
        lib = _LIBS.get(key)
        if lib is None:
            meta = read_meta(Path(key).parent)
            if meta is not None and "variant" in meta:
                why = damage(Path(key), meta.get("library"))
                if why is not None:
                    raise CacheError(f"cache entry {Path(key).parent} is damaged ({why}); "
                                     "run `mlagen cache clear` or build it again")
            lib = ctypes.CDLL(key)
            _LIBS[key] = lib
        return lib


def ptr(t) -> ctypes.c_void_p:
    """A tensor's data pointer for a C call (None for an absent optional tensor)."""
    return ctypes.c_void_p(t.data_ptr() if t is not None else 0)
