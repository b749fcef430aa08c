"""The tuned-defaults table that `mlagen tune --target hopper` writes (tune.py) and the
API's per-shape defaults read (defaults.py): where it lives, how it is keyed, the lookup.

    {"format": 1, "tables": {"<GPU name>|mlagen <version>": {"entries": {
        "b=<batch>,rows=<s_q * h_q>": {"knobs": {...}, ...}}}}}
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

from ...envvars import file_path
from ...paths import PACKAGE_DIR, cache_dir
from ...version import __version__

SHIPPED_TABLE = PACKAGE_DIR / "backends" / "hopper" / "tuned.json"
KNOBS = ("rows_per_tile", "block_kv", "buffers", "warps", "split_cost", "mainloop")


def user_table() -> Path:
    """Where `mlagen tune` writes by default: $MLAGEN_HOPPER_TUNE_TABLE, else the cache."""
    env = file_path("MLAGEN_HOPPER_TUNE_TABLE")
    return env if env is not None else cache_dir() / "hopper_tune.json"


def table_key(gpu: str, version: str = __version__) -> str:
    return f"{gpu}|mlagen {version}"


def shape_key(b: int, rows_total: int) -> str:
    return f"b={b},rows={rows_total}"


_TABLES: dict[str, dict] = {}


def tuned_knobs(gpu: str, b: int, rows_total: int) -> Optional[dict]:
    """The tuned knobs for (b, rows) on this GPU and mlagen version, from the user's table
    then the shipped one: the exact batch, else the nearest measured batch within a factor
    of two; None when nothing was measured near it."""
    found = tuned_entry(gpu, b, rows_total)
    return found[0] if found else None


def tuned_entry(gpu: str, b: int, rows_total: int) -> Optional[tuple[dict, Path, str]]:
    """(knobs, the table's path, the entry's key) behind tuned_knobs, so that an entry
    the rules refuse can be named."""
    key = table_key(gpu)
    for path in (user_table(), SHIPPED_TABLE):
        cache_key = f"{path}"
        if cache_key not in _TABLES:
            try:
                _TABLES[cache_key] = json.loads(path.read_text()) if path.exists() else {}
            except (OSError, json.JSONDecodeError):
                _TABLES[cache_key] = {}
        entries = _TABLES[cache_key].get("tables", {}).get(key, {}).get("entries", {})
        exact = entries.get(shape_key(b, rows_total))
        if exact:
            return dict(exact["knobs"]), path, shape_key(b, rows_total)
        near = []
        for k, e in entries.items():
            kb, kr = (int(x.split("=")[1]) for x in k.split(","))
            if kr == rows_total and abs(math.log2(kb / b)) <= 1:
                near.append((abs(math.log2(kb / b)), kb, k, e))
        if near:
            _, _, k, e = min(near, key=lambda t: (t[0], t[1]))
            return dict(e["knobs"]), path, k
    return None


def forget_tables() -> None:
    """Re-read the tables on the next lookup (after a tuning run in this process)."""
    _TABLES.clear()
