"""The eager calls' host path in C++ (fastcall.cpp), built as a torch extension with
torch.utils.cpp_extension (ninja, a lock, its own staleness check) into mlagen's cache, once
per torch version and Python: ~15 s on a 2-core CPU, then a load per process.

A repeated decode (or metadata) call with a cached plan's exact signature goes through one
C++ call (check the tensors, allocate the outputs, launch) instead of Python building the
signature, allocating each output and making a ctypes call.  MLAGEN_HOPPER_FASTCALL=0 turns
it off; a failed build warns once and the Python path serves every call.
"""

from __future__ import annotations

import ctypes
import hashlib
import sys
import threading
import warnings
from pathlib import Path
from typing import Optional

import torch

from mlagen.paths import cache_dir

SOURCE = Path(__file__).resolve().parent / "fastcall.cpp"
NAME = "mlagen_hopper_fastcall"
_LOCK = threading.Lock()
_MODULE: list = []       # [module or None] once tried in this process
_ERROR: list = []        # why the build failed (its first line), once it has


def enabled() -> bool:
    from mlagen.envvars import switch

    return switch("MLAGEN_HOPPER_FASTCALL", True)


def build_dir() -> Path:
    """One folder per source, torch version and Python (what the compiler sees and what
    the extension links against), so two installs sharing a cache never rebuild each
    other's."""
    src = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    tag = f"torch{torch.__version__}-py{sys.version_info[0]}{sys.version_info[1]}"
    return cache_dir() / "torch_ext" / f"fastcall-{src}-{tag.replace('+', '_')}"


def library_path() -> Path:
    """Where the built extension lies (torch.utils.cpp_extension names it after NAME)."""
    return build_dir() / f"{NAME}.so"


def intact() -> bool:
    """Built, and still the library its build recorded."""
    from mlagen.jit.integrity import beside_damage

    return library_path().exists() and beside_damage(library_path()) is None


def build_error() -> Optional[str]:
    """The first line of the build's error in this process, or None."""
    return _ERROR[0] if _ERROR else None


def module():
    """The built extension, or None (turned off, or its build failed: warned once)."""
    if _MODULE:
        return _MODULE[0]
    if not enabled():
        return None
    with _LOCK:
        if not _MODULE:
            _MODULE.append(_load())
    return _MODULE[0]


def _load():
    from torch.utils import cpp_extension

    from mlagen.jit.integrity import beside_damage, record_beside, remove_beside

    d = build_dir()
    try:
        d.mkdir(parents=True, exist_ok=True)
        why = beside_damage(library_path())
        if why is not None:   # checked before import dlopens it (a short file: a bus error)
            print(f"mlagen: cache entry {d} is damaged ({why}); removed, rebuilding",
                  file=sys.stderr, flush=True)
            remove_beside(library_path())
        m = cpp_extension.load(NAME, [str(SOURCE)], build_directory=str(d),
                               extra_cflags=["-O2"], verbose=False)
        record_beside(library_path())
        return m
    except Exception as e:    # no compiler, headers or ninja: the Python path still works
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        _ERROR.append(first)
        warnings.warn(f"mlagen: the C++ call path did not build in {d} ({first}); "
                      "eager calls take the Python path (~1.5x the host time). "
                      "MLAGEN_HOPPER_FASTCALL=0 silences this.", RuntimeWarning, stacklevel=3)
        return None


def _address(fn) -> int:
    return ctypes.cast(fn, ctypes.c_void_p).value


def decode_plan(like: list, lib, shape, out_shape, lse_shape, ws_numel: int, error: int,
                scale_log2: float) -> Optional[object]:
    """A C++ decode plan for one call signature (like: q, k_cache, block_table,
    cache_seqlens, metadata, num_splits of that signature) over a loaded ctypes library,
    or None."""
    m = module()
    if m is None:
        return None
    return m.DecodePlan(like, _address(lib.mlagen_hopper_decode),
                        _address(lib.mlagen_hopper_error_string), list(shape),
                        list(out_shape), list(lse_shape), int(ws_numel), int(error),
                        float(scale_log2))


def metadata_plan(like, lib, num_parts: int, fixed_splits: int, split_cost: int
                  ) -> Optional[object]:
    """A C++ get_mla_metadata plan for cache_seqlens of like's signature, or None."""
    m = module()
    if m is None:
        return None
    return m.MetadataPlan(like, _address(lib.mlagen_hopper_metadata),
                          _address(lib.mlagen_hopper_error_string), int(num_parts),
                          int(fixed_splits), int(split_cost))
