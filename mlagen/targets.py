"""Target descriptions: data files in targets/, each parameter with its source."""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from .backends import backend, kinds
from .errors import TargetError, clip
from .paths import TARGETS_DIR


@dataclass(frozen=True)
class Target:
    name: str
    kind: str
    path: str
    description: str
    params: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)

    def __getattr__(self, key: str) -> Any:
        params = self.__dict__.get("params", {})
        if key in params:
            return params[key]
        raise AttributeError(f"target {self.__dict__.get('name')!r} has no parameter {key!r}")

    def assumed(self) -> list[str]:
        """Names of parameters whose source says they are assumptions."""
        return [k for k, s in self.sources.items() if "assumed" in s.lower()]


@functools.lru_cache(maxsize=None)
def _load(path: str) -> Target:
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8-sig"))   # a byte-order mark too
    except OSError as e:
        raise TargetError(f"{path}: cannot read target description: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise TargetError(f"{path}: not valid TOML: {e}") from None
    head = data.get("target", {})
    kind = head.get("kind")
    if kind not in kinds():
        raise TargetError(f"{path}: [target] kind = {clip(repr(kind))} must be one of {', '.join(kinds())}")
    params, sources = {}, {}
    for key, entry in data.get("params", {}).items():
        if not isinstance(entry, dict) or "value" not in entry or "source" not in entry:
            raise TargetError(f"{path}: parameter {key} must be {{ value = ..., source = ... }}")
        params[key], sources[key] = entry["value"], entry["source"]
    return Target(name=head.get("name", p.stem), kind=kind, path=str(p),
                  description=head.get("description", ""), params=params, sources=sources)


def target_path(name: str, file: str | None = None, base: Path | None = None) -> Path:
    """The description file of a target: ``file`` (relative to the schedule's folder or
    to targets/) or the default file of ``name``'s backend."""
    if file is None:
        if name not in kinds():
            raise TargetError(f"unknown target {name!r}; known: {', '.join(kinds())}")
        return TARGETS_DIR / backend(name).target_file
    cand = Path(file)
    if cand.is_absolute():
        return cand
    for root in ([base] if base else []) + [Path.cwd(), TARGETS_DIR.parent, TARGETS_DIR]:
        if (root / cand).exists():
            return root / cand
    return cand


def load_target(name: str, file: str | None = None, base: Path | None = None) -> Target:
    return _load(str(target_path(name, file, base).resolve()))
