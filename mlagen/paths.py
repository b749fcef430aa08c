"""Where mlagen's data lives: in the source tree, or installed beside the package."""

from __future__ import annotations

from pathlib import Path

from .envvars import EnvironmentVariableError, folder

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


def schedule_path(name: str | Path) -> Path:
    """The one rule for finding a schedule by name, used by every command and by
    ``mlagen.load_schedule``: the path as given when something is there; else, for a bare
    name or ``schedules/<name>`` (with or without ``.toml``), the example of that name
    shipped with mlagen (so the README's commands work outside a checkout too); else the
    path as given (whose reading then says what is wrong)."""
    p = Path(name)
    if p.exists() or p.parent not in (Path("."), Path("schedules")) or not p.name:
        return p
    shipped = SCHEDULES_DIR / (p.name if p.suffix == ".toml" else p.name + ".toml")
    return shipped if shipped.is_file() else p


def cache_dir() -> Path:
    """Build cache: $MLAGEN_CACHE_DIR, else $XDG_CACHE_HOME/mlagen, else ~/.cache/mlagen.
    A ``~user`` that does not expand, or a path that is a file, is refused
    (EnvironmentVariableError naming the variable), never taken for an empty cache."""
    env = folder("MLAGEN_CACHE_DIR")
    if env is not None:
        return env
    xdg = folder("XDG_CACHE_HOME")
    if xdg is None:
        try:
            xdg = Path.home() / ".cache"
        except RuntimeError:       # no $HOME and no passwd entry
            raise EnvironmentVariableError(
                "MLAGEN_CACHE_DIR", "unset, and there is no home folder to cache in "
                "(set it to a folder)") from None
    return folder("MLAGEN_CACHE_DIR", str(xdg / "mlagen"))
