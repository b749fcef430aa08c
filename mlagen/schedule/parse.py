"""Schedule files (TOML) to records and back, keeping line positions for messages."""

from __future__ import annotations

import dataclasses
import difflib
import re
import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from ..errors import ScheduleError
from .records import Mapping, Problem, Schedule, TargetRef

TABLES = {"problem": Problem, "target": TargetRef, "schedule": Mapping}
# Keys a file may not set although the record has them.
_HIDDEN = {"schedule": set(), "problem": set(), "target": set()}

_HEADER = re.compile(r"^\s*\[\s*([A-Za-z0-9_.-]+)\s*\]\s*(#.*)?$")
_KEY = re.compile(r"^\s*([A-Za-z0-9_-]+|\"[^\"]*\")\s*=")


def _positions(text: str) -> dict[tuple[str, str | None], int]:
    """Line (1-based) of each table header and of each ``key =`` inside a table."""
    pos: dict[tuple[str, str | None], int] = {}
    table = ""
    for lineno, line in enumerate(text.splitlines(), 1):
        m = _HEADER.match(line)
        if m:
            table = m.group(1)
            pos.setdefault((table, None), lineno)
            continue
        m = _KEY.match(line)
        if m:
            pos.setdefault((table, m.group(1).strip('"')), lineno)
    return pos


class Located:
    """Where each key of a schedule came from, so rules can point at a line."""

    def __init__(self, source: str | None, positions: dict[tuple[str, str | None], int]):
        self.source = source
        self.positions = positions

    def error(self, table: str, key: str | None, message: str) -> ScheduleError:
        line = self.positions.get((table, key)) or self.positions.get((table, None))
        return ScheduleError(message, file=self.source, line=line)


def _field_kinds(record: type) -> dict[str, tuple[type, ...]]:
    """Accepted Python types of each field, from its default value (bool is not an int)."""
    kinds: dict[str, tuple[type, ...]] = {}
    for f in dataclasses.fields(record):
        default = f.default if f.default is not dataclasses.MISSING else None
        if f.name == "softmax_scale" or f.name == "file":
            kinds[f.name] = (float, int) if f.name == "softmax_scale" else (str,)
        elif f.name == "split_kv":
            kinds[f.name] = (int, str)
        elif isinstance(default, bool):
            kinds[f.name] = (bool,)
        elif isinstance(default, int):
            kinds[f.name] = (int,)
        elif isinstance(default, float):
            kinds[f.name] = (float, int)
        else:
            kinds[f.name] = (str,)
    return kinds


def _type_name(kinds: tuple[type, ...]) -> str:
    names = {bool: "a boolean (true/false)", int: "an integer", float: "a number",
             str: "a string"}
    return " or ".join(dict.fromkeys(names[k] for k in kinds))


def schedule_from_tables(tables: dict[str, Any], source: str | None, name: str,
                         positions: dict[tuple[str, str | None], int] | None = None
                         ) -> Schedule:
    """Tables (as TOML gives them) to a checked Schedule; every error names its line."""
    from .rules import check  # rules import records only; no cycle at import time

    loc = Located(source, positions or {})
    for table in tables:
        if table not in TABLES:
            hint = difflib.get_close_matches(table, TABLES, n=1)
            extra = f"; did you mean [{hint[0]}]?" if hint else \
                f"; tables are {', '.join('[' + t + ']' for t in TABLES)}"
            raise loc.error(table, None, f"unknown table [{table}]{extra}")
    values: dict[str, dict[str, Any]] = {}
    for table, record in TABLES.items():
        given = tables.get(table, {})
        if not isinstance(given, dict):
            raise loc.error(table, None, f"[{table}] must be a table")
        kinds = _field_kinds(record)
        allowed = [k for k in kinds if k not in _HIDDEN[table]]
        for key, value in given.items():
            if key not in allowed:
                hint = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
                others = [t for t, r in TABLES.items() if t != table and
                          key in _field_kinds(r)]
                if hint:
                    extra = f"; did you mean '{hint[0]}'?"
                elif others:
                    extra = f"; '{key}' belongs in [{others[0]}]"
                else:
                    extra = f"; known keys: {', '.join(allowed)}"
                raise loc.error(table, key, f"unknown key '{key}' in [{table}]{extra}")
            ok = kinds[key]
            if isinstance(value, bool) and bool not in ok or not isinstance(value, ok):
                raise loc.error(table, key, f"{key} = {value!r} must be {_type_name(ok)}")
        values[table] = dict(given)
    if "name" not in values["target"] and tables:
        raise loc.error("target", None, "[target] needs name = \"sc11\" or \"hopper\"")
    if values["problem"].get("softmax_scale") is not None:
        values["problem"]["softmax_scale"] = float(values["problem"]["softmax_scale"])
    schedule = Schedule(problem=Problem(**values["problem"]),
                        target=TargetRef(**values["target"]),
                        mapping=Mapping(**values["schedule"]), name=name, source=source)
    check(schedule, loc)
    return schedule


def loads(text: str, source: str | None = None, name: str = "unnamed") -> Schedule:
    try:
        tables = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        m = re.search(r"line (\d+)", str(e))
        raise ScheduleError(f"not valid TOML: {e}", file=source,
                            line=int(m.group(1)) if m else None) from None
    return schedule_from_tables(tables, source, name, _positions(text))


def load(path: str | Path) -> Schedule:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ScheduleError(f"cannot read schedule: {e.strerror}", file=str(path)) from None
    return loads(text, source=str(path), name=path.stem)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def dumps(schedule: Schedule) -> str:
    """The schedule as a TOML file; ``loads(dumps(s))`` equals ``s`` (name and source aside)."""
    out = [f"# mlagen schedule '{schedule.name}'"]
    for table, record in (("problem", schedule.problem), ("target", schedule.target),
                          ("schedule", schedule.mapping)):
        out.append(f"\n[{table}]")
        for f in dataclasses.fields(record):
            value = getattr(record, f.name)
            if value is None:
                continue
            out.append(f"{f.name} = {_toml_value(value)}")
    return "\n".join(out) + "\n"
