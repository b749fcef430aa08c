"""One planted source mutation: the record a backend's mutant list is made of, and the
context that makes every build (in this process and the workers it starts) compile it.
The harness is mutants.py; the lists are each backend's ``mutants()``."""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from ..jit import patches as jit_patches


@dataclass(frozen=True)
class Mutant:
    name: str
    target: str
    file: str                   # base name of the template or header it edits
    old: str                    # one line (or a unique part of one), exactly once
    new: str
    what: str                   # the slip, in words
    schedules: tuple[str, ...]  # example schedules (schedules/<name>.toml) whose kernels run it
    escape: str = ""            # the escape class it stands for, if any

    def patch(self) -> jit_patches.Patch:
        return jit_patches.Patch(self.file, self.old, self.new)


@contextmanager
def planted(mutant: Mutant) -> Iterator[Path]:
    """The mutant's patch active for every build in this process and its children."""
    old = os.environ.get(jit_patches.ENV)
    with tempfile.TemporaryDirectory(prefix="mlagen-mutant-") as d:
        path = jit_patches.save([mutant.patch()], Path(d) / f"{mutant.name}.json")
        os.environ[jit_patches.ENV] = str(path)
        try:
            yield path
        finally:
            if old is None:
                os.environ.pop(jit_patches.ENV, None)
            else:
                os.environ[jit_patches.ENV] = old
