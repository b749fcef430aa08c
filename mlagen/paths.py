"""Where mlagen's data lives: in the source tree, or installed beside the package."""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent


def _data_root() -> Path:
    # Editable/source checkout: templates/ and targets/ sit beside the package.
    # Installed wheel: they are shipped inside the package as mlagen/_data.
    for root in (PACKAGE_DIR.parent, PACKAGE_DIR / "_data"):
        if (root / "templates").is_dir() and (root / "targets").is_dir():
            return root
    return PACKAGE_DIR.parent


DATA_ROOT = _data_root()
TEMPLATES_DIR = DATA_ROOT / "templates"
TARGETS_DIR = DATA_ROOT / "targets"
SCHEDULES_DIR = DATA_ROOT / "schedules"


def cache_dir() -> Path:
    """Build cache: $MLAGEN_CACHE_DIR, else $XDG_CACHE_HOME/mlagen, else ~/.cache/mlagen."""
    env = os.environ.get("MLAGEN_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "mlagen"
