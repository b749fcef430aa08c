"""Reading one environment variable of a kind (a folder, a file, a whole number, a
switch), refusing a value it cannot use with one line that names the variable.  What is
read where, and the up-front check of them all: mlagen/environment.py."""

from __future__ import annotations

import os
from pathlib import Path

from .errors import MlagenError, clip


class EnvironmentVariableError(MlagenError, ValueError):
    """An environment variable mlagen reads has a value it cannot use."""

    def __init__(self, var: str, message: str):
        self.var = var
        super().__init__(f"{var}: {message}")


def shown(value: str, limit: int = 80) -> str:
    """A value as an error line shows it: repr, at most ~limit characters."""
    return clip(repr(value), limit)


def expand_path(var: str, value: str) -> Path:
    """``value`` with ``~`` / ``~user`` expanded; a ``~user`` that names no user (or a
    ``~`` without a home) is refused rather than taken for a folder called ``~user``."""
    if "\0" in value or "\n" in value:
        raise EnvironmentVariableError(var, f"{shown(value)} is not a path (a NUL or newline)")
    p = Path(value)
    if value.startswith("~"):
        try:
            p = p.expanduser()
        except RuntimeError:
            p = Path(value)
        if str(p).startswith("~"):
            user = value.split("/", 1)[0]
            raise EnvironmentVariableError(
                var, f"{shown(value)}: {user} does not expand (no such user or no home)")
    return p


def folder(var: str, value: str | None = None) -> Path | None:
    """A folder variable (made on first use): absent or empty -> None; ``~user`` that does
    not expand, or an existing thing that is no folder, is refused."""
    value = os.environ.get(var) if value is None else value
    if not value:
        return None
    p = expand_path(var, value)
    if p.exists() and not p.is_dir():
        raise EnvironmentVariableError(var, f"{shown(str(p))} is a file, not a folder")
    parent = p.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise EnvironmentVariableError(var, f"{shown(str(p))}: {parent} is a file, not a folder")
    return p


def file_path(var: str) -> Path | None:
    """A file variable (written on use): absent or empty -> None; a folder is refused."""
    value = os.environ.get(var)
    if not value:
        return None
    p = expand_path(var, value)
    if p.is_dir():
        raise EnvironmentVariableError(var, f"{shown(str(p))} is a folder, not a file")
    return p


def whole_number(var: str, lo: int = 1) -> int | None:
    value = os.environ.get(var)
    if value is None or value == "":
        return None
    try:
        n = int(value.strip())
    except ValueError:
        raise EnvironmentVariableError(var, f"{shown(value)} is not a whole number") from None
    if n < lo:
        raise EnvironmentVariableError(var, f"{shown(value)} must be at least {lo}")
    return n


def switch(var: str, default: bool) -> bool:
    """An on/off variable: unset or empty -> default, "0" off, "1" on; else refused."""
    value = os.environ.get(var)
    if value is None or value.strip() == "":
        return default
    if value.strip() in ("0", "1"):
        return value.strip() == "1"
    raise EnvironmentVariableError(var, f"{shown(value)} must be 0 (off) or 1 (on)")
