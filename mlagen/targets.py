"""Target descriptions: data files in targets/, each parameter with its source.

This module reads a description file; which file a target kind uses by default is its
backend's, so ``load_target(kind, ...)`` lives in the registry (mlagen/backends/__init__.py).
"""

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

from .errors import TargetError
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
def read_target(path: str) -> Target:
    """The description in the file at ``path`` (read once per process)."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8-sig"))   # a byte-order mark too
    except OSError as e:
        raise TargetError(f"{path}: cannot read target description: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise TargetError(f"{path}: not valid TOML: {e}") from None
    head = data.get("target", {})
    kind = head.get("kind")    # checked against the backends by registry.load_target
    params, sources = {}, {}
    for key, entry in data.get("params", {}).items():
        if not isinstance(entry, dict) or "value" not in entry or "source" not in entry:
            raise TargetError(f"{path}: parameter {key} must be {{ value = ..., source = ... }}")
        params[key], sources[key] = entry["value"], entry["source"]
    return Target(name=head.get("name", p.stem), kind=kind, path=str(p),
                  description=head.get("description", ""), params=params, sources=sources)


def find_file(file: str, base: Path | None = None) -> Path:
    """A description file named in a schedule: absolute, or relative to the schedule's
    folder (base), the working directory, the repository or targets/ (the first that has
    it; the name itself when none does)."""
    cand = Path(file)
    if cand.is_absolute():
        return cand
    for root in ([base] if base else []) + [Path.cwd(), TARGETS_DIR.parent, TARGETS_DIR]:
        if (root / cand).exists():
            return root / cand
    return cand
