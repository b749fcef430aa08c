"""The backend registry: one subpackage per target kind, each holding one ``Backend`` object
(``mlagen/backends/<kind>/backend.py``, attribute ``BACKEND``).

The registry finds backends by looking at this folder, so adding a target is a new backend
folder, its templates (templates/<kind>/) and its description (targets/), nothing else.
The core reaches a target only through these functions; the backend modules are imported
on first use (importlib), so the core never imports a backend statically.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import pkgutil
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import MlagenError, TargetError, clip
from ..paths import TARGETS_DIR
from ..targets import Target, find_file, read_target

if TYPE_CHECKING:  # pragma: no cover
    from .base import Backend


@functools.lru_cache(maxsize=None)
def kinds() -> tuple[str, ...]:
    """Every target kind: the subpackages of mlagen/backends/ that hold a backend.py."""
    found = []
    for m in pkgutil.iter_modules(__path__):
        if m.ispkg and importlib.util.find_spec(f"{__name__}.{m.name}.backend") is not None:
            found.append(m.name)
    return tuple(sorted(found))


@functools.lru_cache(maxsize=None)
def backend(kind: str) -> "Backend":
    """The backend object of a target kind (KeyError for an unknown kind)."""
    if kind not in kinds():
        raise KeyError(kind)
    return importlib.import_module(f"{__name__}.{kind}.backend").BACKEND


def backend_for(schedule) -> "Backend":
    return backend(schedule.target.kind)


def require_device(schedule) -> None:
    """Raise MlagenError (one line, exit 2 from the CLI) when this machine cannot run the
    schedule's kernel (its backend's device_check), before anything is built, drawn or
    saved."""
    why = backend_for(schedule).device_check()
    if why:
        raise MlagenError(why)


def all_backends() -> list["Backend"]:
    return [backend(k) for k in kinds()]


@functools.lru_cache(maxsize=None)
def default_kind() -> str:
    """The kind a schedule gets when it names none: the backend marked ``default``."""
    marked = [b.kind for b in all_backends() if b.default]
    if len(marked) != 1:
        raise RuntimeError(f"exactly one backend must be the default; marked: {marked}")
    return marked[0]


def target_path(kind: str, file: str | None = None, base: Path | None = None) -> Path:
    """The description file of a target: ``file`` (found by targets.find_file from the
    schedule's folder ``base``) or the default file of ``kind``'s backend."""
    if file is None:
        if kind not in kinds():
            raise TargetError(f"unknown target {clip(repr(kind))}; known: {', '.join(kinds())}")
        return TARGETS_DIR / backend(kind).target_file
    return find_file(file, base)


def load_target(kind: str, file: str | None = None, base: Path | None = None) -> Target:
    """The description a schedule of ``kind`` (naming ``file``, or none) is checked
    against; TargetError when it cannot be read or names a kind no backend has."""
    path = target_path(kind, file, base).resolve()
    t = read_target(str(path))
    if t.kind not in kinds():
        raise TargetError(f"{path}: [target] kind = {clip(repr(t.kind))} must be one of "
                          f"{', '.join(kinds())}")
    return t
