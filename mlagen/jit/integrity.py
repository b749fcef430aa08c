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


# A library built outside mlagen.jit (torch.utils.cpp_extension's, with its own staleness
# check that a short file passes) keeps its record beside it.
def _record_path(path: Path) -> Path:
    return Path(str(path) + ".integrity.json")


def record_beside(path: Path) -> None:
    """Record ``path``'s size and sha256 beside it (after a build that loaded)."""
    path = Path(path)
    if path.is_file():
        tmp = _record_path(path).with_suffix(f".{uuid.uuid4().hex[:8]}.tmp")
        tmp.write_text(json.dumps(fingerprint(path)))
        os.replace(tmp, _record_path(path))


def beside_damage(path: Path) -> str | None:
    """Why the library at ``path`` differs from the record beside it (None when it does
    not, or when there is no library)."""
    path = Path(path)
    if not path.exists():
        return None
    try:
        recorded = json.loads(_record_path(path).read_text())
    except (OSError, ValueError):
        recorded = None
    return damage(path, recorded if isinstance(recorded, dict) else None)


def remove_beside(path: Path) -> None:
    """Remove a damaged library and its record, so that its builder makes it again."""
    for p in (Path(path), _record_path(Path(path))):
        try:
            p.unlink()
        except FileNotFoundError:
            pass
