"""The example schedules in schedules/ and their generated sources in generated/.

generated/<schedule>/ holds exactly what `mlagen generate` renders for each example; a test
regenerates them and requires byte-identical files, so a template change shows in review.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

from .paths import DATA_ROOT, SCHEDULES_DIR

EXAMPLES_OUT = DATA_ROOT / "generated"


def example_schedules() -> list[Path]:
    return sorted(SCHEDULES_DIR.glob("*.toml"))


def regenerate(out: Path = EXAMPLES_OUT) -> list[Path]:
    """Render every example into out/<stem>/, replacing what was there."""
    from . import generate
    from .schedule import load

    written: list[Path] = []
    for path in example_schedules():
        # a path relative to the project keeps the generated headers machine-independent
        s = dataclasses.replace(load(path), source=os.path.relpath(path, DATA_ROOT))
        target = out / path.stem
        shutil.rmtree(target, ignore_errors=True)
        written += generate(s, target, headers=False)   # headers stay in templates/
    return written
