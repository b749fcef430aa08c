"""What a published build's library must still be: its size and sha256, recorded when it
was published and checked before it is loaded.

A disk that filled up mid-copy, a killed rsync or a shared cache on NFS leave a library
that is short, empty or garbled; dlopen of a short ELF file can kill the process with a bus
error (nothing on stderr), so the check comes before dlopen, not after it fails.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path

from ..errors import MlagenError


class CacheError(MlagenError):
    """A cache entry is damaged and could not be repaired by one rebuild."""


def fingerprint(path: Path) -> dict:
    """The record a library is checked against: its size in bytes and sha256."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return {"size": os.path.getsize(path), "sha256": h.hexdigest()}


def damage(path: Path, recorded: dict | None) -> str | None:
    """Why the library at ``path`` is not the one ``recorded`` (None when it is)."""
    if not recorded or "size" not in recorded or "sha256" not in recorded:
        return "no size and checksum recorded (a half-copied or foreign entry)"
    try:
        size = os.path.getsize(path)
    except OSError:
        return f"{Path(path).name} is missing"
    if size != recorded["size"]:
        return f"{Path(path).name} is {size} bytes, {recorded['size']} were published"
    if fingerprint(path)["sha256"] != recorded["sha256"]:
        return f"{Path(path).name}'s sha256 differs from the one published"
    return None


def read_meta(directory: Path) -> dict | None:
    try:
        meta = json.loads((Path(directory) / "meta.json").read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def entry_damage(directory: Path, lib_name: str) -> str | None:
    """Why a published entry cannot be loaded (None when its library is intact)."""
    meta = read_meta(directory)
    if meta is None:
        return "its meta.json is missing or unreadable (a half-copied entry)"
    return damage(Path(directory) / lib_name, meta.get("library"))


def quarantine(directory: Path, scrap: Path) -> None:
    """Take a damaged entry out of the cache: one atomic rename into ``scrap`` (readers see
    the entry or nothing), then remove it."""
    scrap.mkdir(parents=True, exist_ok=True)
    dest = scrap / f"{Path(directory).name}.damaged.{uuid.uuid4().hex[:8]}"
    try:
        os.rename(directory, dest)
    except FileNotFoundError:       # another process took it out first
        return
    shutil.rmtree(dest, ignore_errors=True)
