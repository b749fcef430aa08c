"""Source patches: textual edits made to a copy of a SourceSet's files before it compiles.

The verifier's mutation harness (mlagen.verify.mutants) plants one-line faults this way:
the environment variable ENV names a JSON file of patches, and every build in the process
(and in the worker processes it starts, which inherit the environment) compiles the
patched copy.  The templates on disk are never touched, no schedule field changes, and a
patched build has its own cache key (its include folders are the patched copies).

A patch names a file by its base name (a rendered file such as ``split.cu`` or a header
such as ``mla.h``); a SourceSet without that file is left alone (another target's patch).
A patch whose file is there but whose text is not, exactly ``count`` times, is an error: a
stale mutant must not pass for a caught one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from ..codegen import HEADER_SUFFIXES, SourceSet
from ..errors import MlagenError
from ..paths import cache_dir

ENV = "MLAGEN_SOURCE_PATCHES"


class PatchError(MlagenError):
    """A patch that does not apply (its text is missing or ambiguous)."""


@dataclass(frozen=True)
class Patch:
    file: str            # base name of the file to edit
    old: str             # text to replace (must occur exactly `count` times)
    new: str
    count: int = 1

    def apply_to(self, text: str, where: str) -> str:
        n = text.count(self.old)
        if n != self.count:
            raise PatchError(f"patch of {self.file}: {self.old.strip()!r} occurs {n} times in "
                             f"{where}, expected {self.count}")
        return text.replace(self.old, self.new)


def save(patches: Sequence[Patch], path: Path) -> Path:
    path = Path(path)
    path.write_text(json.dumps([dataclasses.asdict(p) for p in patches], indent=1))
    return path


def load(path: Path) -> list[Patch]:
    try:
        data = json.loads(Path(path).read_text())
        return [Patch(**d) for d in data]
    except (OSError, ValueError, TypeError) as e:
        raise PatchError(f"{ENV}={path}: not a readable patch file ({e})") from None


def active() -> list[Patch]:
    """The patches ENV names (none when it is unset or empty)."""
    path = os.environ.get(ENV)
    return load(Path(path)) if path else []


def _digest(patches: Sequence[Patch], roots: Sequence[str]) -> str:
    h = hashlib.sha256()
    for p in patches:
        h.update(json.dumps(dataclasses.asdict(p), sort_keys=True).encode() + b"\0")
    for root in roots:
        for f in sorted(Path(root).rglob("*")):
            if f.is_file():
                h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def apply(sources: SourceSet, patches: Optional[Sequence[Patch]] = None) -> SourceSet:
    """`sources` with `patches` (default: the active ones) applied: rendered files edited
    in place, include folders replaced by patched copies under <cache dir>/patched/."""
    patches = active() if patches is None else list(patches)
    if not patches:
        return sources
    files = dict(sources.files)
    headers = {}                      # base name -> (include index, relative path)
    for i, inc in enumerate(sources.include_dirs):
        for f in Path(inc).rglob("*"):
            if f.is_file() and f.suffix in HEADER_SUFFIXES:
                headers.setdefault(f.name, (i, f.relative_to(inc)))
    mine = [p for p in patches if p.file in headers
            or any(Path(n).name == p.file for n in files)]
    if not mine:
        return sources
    for p in mine:
        for name in files:
            if Path(name).name == p.file:
                files[name] = p.apply_to(files[name], name)
    on_headers = [p for p in mine if p.file in headers]
    include_dirs = sources.include_dirs
    if on_headers:
        root = cache_dir() / "patched" / _digest(on_headers, sources.include_dirs)
        if not root.is_dir():
            work = root.with_name(f"{root.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}")
            for i, inc in enumerate(sources.include_dirs):
                shutil.copytree(inc, work / f"inc{i}")
            for p in on_headers:
                i, rel = headers[p.file]
                f = work / f"inc{i}" / rel
                f.write_text(p.apply_to(f.read_text(), p.file))
            root.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.rename(work, root)          # atomic: another process may have won
            except OSError:
                shutil.rmtree(work, ignore_errors=True)
        include_dirs = tuple(str(root / f"inc{i}") for i in range(len(sources.include_dirs)))
    return dataclasses.replace(sources, files=files, include_dirs=include_dirs,
                               variant=sources.variant + "-patched")
