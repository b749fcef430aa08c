"""Schedule files (TOML) to records and back, keeping line positions for messages."""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from ..backends import all_backends, backend, kinds
from ..errors import ScheduleError, clip
from .located import Located, Positions
from .records import Mapping, Problem, Schedule, TargetRef
from .rules import check, remember

# The tables of a file and their records; [schedule]'s record is the target's own knob
# record (a subclass of Mapping, from its backend).
TABLES = {"problem": Problem, "target": TargetRef, "schedule": Mapping}

_PROBE = "mlagen_probe_"


def _holds(data: dict, parent: tuple[str, ...], key: str) -> bool:
    node: Any = data
    for part in parent:
        node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, list):                 # an array of tables: its last table
            node = node[-1] if node and isinstance(node[-1], dict) else None
    return isinstance(node, dict) and key in node


def _positions(text: str, data: dict | None = None) -> Positions:
    """Line (1-based) of each table and of each key inside a table, keyed (table, key);
    (table, None) is where the table starts (its header, or ``table = {`` ...).

    tomllib gives values, not lines, so tomllib also says where each key is: every place
    the key's name is written is tried in turn, renamed to a probe, and the first one whose
    renaming renames the key in tomllib's result is the key's line.  A name inside a
    string, a comment or another table's key never passes that test."""
    try:
        data = tomllib.loads(text) if data is None else data
    except tomllib.TOMLDecodeError:
        return {}
    wanted: list[tuple[tuple[str, ...], str, tuple[str, str | None]]] = []
    for table, value in data.items():
        wanted.append(((), table, (table, None)))
        if isinstance(value, dict):
            wanted += [((table,), key, (table, key)) for key in value]
    pos: Positions = {}
    for parent, key, where in wanted:
        for m in re.finditer(rf"(?<![A-Za-z0-9_-]){re.escape(key)}(?![A-Za-z0-9_-])", text):
            try:
                probed = tomllib.loads(text[:m.start()] + _PROBE + key + text[m.end():])
            except tomllib.TOMLDecodeError:
                continue
            if _holds(probed, parent, _PROBE + key):
                pos[where] = text.count("\n", 0, m.start()) + 1
                break
    return pos


_TYPES = {"int": (int,), "float": (float, int), "str": (str,), "bool": (bool,)}


def _field_kinds(record: type) -> dict[str, tuple[type, ...]]:
    """Accepted Python types of each field, from its annotation (bool is not an int; an
    integer is a number)."""
    kinds_: dict[str, tuple[type, ...]] = {}
    for f in dataclasses.fields(record):
        names = re.findall(r"\b(int|float|str|bool)\b", str(f.type))
        kinds_[f.name] = tuple(dict.fromkeys(k for n in names for k in _TYPES[n]))
    return kinds_


def _type_name(kinds: tuple[type, ...]) -> str:
    names = {bool: "a boolean (true/false)", int: "an integer", float: "a number",
             str: "a string"}
    return " or ".join(dict.fromkeys(names[k] for k in kinds))


def _kind_of(value: Any) -> str:
    """What TOML type a value has, in words (for "must be an integer, not a string")."""
    for kind, name in ((bool, "a boolean"), (int, "an integer"), (float, "a float"),
                       (str, "a string"), (list, "an array"), (dict, "a table")):
        if isinstance(value, kind):
            return name
    return "a date/time"


def _shown(key: str, value: Any) -> str:
    """``key = value`` as the file spells it (scalars only: arrays and tables are long)."""
    if isinstance(value, (bool, int, float, str)):
        return clip(f"{key} = {_toml_value(value)}")
    return clip(key)


def _records(table: str) -> list[type]:
    if table == "schedule":
        return [b.mapping for b in all_backends()]
    return [TABLES[table]]


def _owner(key: str) -> str | None:
    for table in TABLES:
        if any(key in _field_kinds(r) for r in _records(table)):
            return table
    return None


def _validate(loc: Located, table: str, given: dict[str, Any], record: type,
              kind: str | None = None) -> dict[str, Any]:
    """The table's keys and value types against its record; returns the values."""
    kinds_ = _field_kinds(record)
    allowed = list(kinds_)
    for key, value in given.items():
        if key not in allowed:
            if table == "schedule" and _owner(key) == "schedule":   # another target's knob
                why = backend(kind).foreign_why.get(key, "") if kind else ""
                raise loc.error(table, key, f"{clip(key)} is not a knob of target {kind}{why}")
            hint = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
            other = _owner(key)
            if other and other != table:
                extra = f"; '{key}' belongs in [{other}]"
            elif hint:
                extra = f"; did you mean '{hint[0]}'?"
            else:
                extra = f"; known keys: {', '.join(allowed)}"
            raise loc.error(table, key, f"unknown key '{clip(key)}' in [{table}]{extra}")
        ok = kinds_[key]
        if isinstance(value, bool) and bool not in ok or not isinstance(value, ok):
            raise loc.error(table, key, f"{_shown(key, value)} must be {_type_name(ok)}, "
                                        f"not {_kind_of(value)}")
    return dict(given)


def _old_target_key(loc: Located, given: Any) -> Any:
    """``[target] name = ...`` (the key's old spelling) read as ``kind``, with a one-line
    notice on stderr."""
    if not isinstance(given, dict) or "name" not in given:
        return given
    if "kind" in given:
        raise loc.error("target", "name", "give kind only (name is its old spelling)")
    given = {("kind" if k == "name" else k): v for k, v in given.items()}
    line = loc.positions.get(("target", "name"))
    if line is not None:
        loc.positions[("target", "kind")] = line
    where = (loc.source or "<schedule>") + (f":{line}" if line else "")
    print(f"mlagen: {where}: [target] name is deprecated; write kind = "
          f"{_toml_value(given['kind'])}", file=sys.stderr)
    return given


def _known_kinds() -> str:
    return " or ".join(f'"{k}"' for k in kinds())


def schedule_from_tables(tables: dict[str, Any], source: str | None, name: str,
                         positions: Positions | None = None) -> Schedule:
    """Tables (as TOML gives them) to a checked Schedule; every error names its line."""
    loc = Located(source, positions or {})
    for table, given in tables.items():
        if table in TABLES:
            if not isinstance(given, dict):
                raise loc.error(table, None, f"[{table}] must be a table, not {_kind_of(given)}"
                                + ("" if not isinstance(given, list) else
                                   f" (write [{table}], not [[{table}]])"))
            continue
        owner = _owner(table)
        if not isinstance(given, dict):
            where = f"in [{owner}]" if owner else \
                f"in one of {', '.join('[' + t + ']' for t in TABLES)}"
            raise loc.error(table, None, f"'{clip(table)}' is outside any table; keys go {where}")
        hint = difflib.get_close_matches(table, TABLES, n=1)
        extra = f"; did you mean [{hint[0]}]?" if hint else \
            f"; tables are {', '.join('[' + t + ']' for t in TABLES)}"
        raise loc.error(table, None, f"unknown table [{clip(table)}]{extra}")
    problem = _validate(loc, "problem", tables.get("problem", {}), Problem)
    target = _validate(loc, "target", _old_target_key(loc, tables.get("target", {})), TargetRef)
    if "kind" not in target:
        raise loc.error("target", None, f"[target] needs kind = {_known_kinds()}")
    kind = target["kind"]
    if kind not in kinds():
        raise loc.error("target", "kind",
                        f"unknown target {clip(repr(kind))}; known: {', '.join(kinds())}")
    record = backend(kind).mapping
    mapping = _validate(loc, "schedule", tables.get("schedule", {}), record, kind)
    if problem.get("softmax_scale") is not None:
        problem["softmax_scale"] = float(problem["softmax_scale"])
    schedule = Schedule(problem=Problem(**problem), target=TargetRef(**target),
                        mapping=record(**mapping), name=name, source=source)
    remember(check(schedule, loc))
    return schedule


def build(name: str = "unnamed", target: str | None = None, target_file: str | None = None,
          **knobs: Any) -> Schedule:
    """A checked schedule from keyword knobs (``Schedule.build``): problem fields by name,
    the rest into [schedule]."""
    from ..backends import default_kind

    problem_names = {f.name for f in dataclasses.fields(Problem)}
    tables: dict[str, dict[str, Any]] = {"problem": {}, "target": {"kind": target or
                                                                   default_kind()},
                                          "schedule": {}}
    if target_file is not None:
        tables["target"]["file"] = target_file
    for key, value in knobs.items():
        tables["problem" if key in problem_names else "schedule"][key] = value
    return schedule_from_tables(tables, source=None, name=name)


# tomllib's terse phrases, said the way a schedule's author thinks of them
_TOML_HINTS = [
    (re.compile(r"Illegal character '\\n'"), "unexpected end of line (a string left open?)"),
    (re.compile(r"Cannot overwrite a value"), "a key given twice"),
    (re.compile(r"Cannot declare \('?([^)]*?)'?,?\) twice"), r"table [\1] given twice"),
]


def loads(text: str, source: str | None = None, name: str = "unnamed") -> Schedule:
    try:
        tables = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        # tomllib says "Invalid value (at line 4, column 12)": the line goes in front
        m = re.search(r"\s*\(at line (\d+), column (\d+)\)", str(e))
        what = str(e)[:m.start()] if m else str(e)
        for pattern, said in _TOML_HINTS:
            what = pattern.sub(said, what)
        what += f" (column {m.group(2)})" if m else ""
        raise ScheduleError(f"not valid TOML: {what}", file=source,
                            line=int(m.group(1)) if m else None) from None
    return schedule_from_tables(tables, source, name, _positions(text, tables))


MAX_SCHEDULE_BYTES = 1 << 20   # a schedule is a few hundred bytes; refuse to slurp a disk


def read_text_file(path: str | Path, what: str = "schedule") -> str:
    """The UTF-8 text of a small file, or a ScheduleError that says in one line why not
    (missing, a folder, too large, binary, not UTF-8, empty).  At most 1 MiB is read, so
    /dev/zero or a huge file is refused without filling memory."""
    path = Path(path)
    where = str(path)
    try:
        if path.is_dir():
            raise ScheduleError(f"cannot read {what}: is a directory", file=where)
        with path.open("rb") as f:
            data = f.read(MAX_SCHEDULE_BYTES + 1)
    except OSError as e:
        raise ScheduleError(f"cannot read {what}: {e.strerror or e}", file=where) from None
    if len(data) > MAX_SCHEDULE_BYTES:
        raise ScheduleError(f"not a {what}: larger than {MAX_SCHEDULE_BYTES >> 20} MiB",
                            file=where)
    if b"\0" in data:
        raise ScheduleError(f"not a {what}: a binary file (TOML text expected)", file=where)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ScheduleError(f"not UTF-8 text (byte 0x{data[e.start]:02x}); a {what} is "
                            f"TOML in UTF-8", file=where, line=line) from None
    if text.startswith("\ufeff"):   # a byte-order mark (Windows editors write one): UTF-8
        text = text[1:]               # all the same, and TOML's parser refuses it
    if not text.strip():
        raise ScheduleError(f"{what} file is empty", file=where)
    return text


def load(path: str | Path) -> Schedule:
    """Parse and check a schedule file (ScheduleError with file and line when it is not);
    a name that is no file finds a shipped example (mlagen.paths.schedule_path)."""
    from ..paths import schedule_path

    path = schedule_path(path)
    return loads(read_text_file(path), source=str(path), name=path.stem)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    # JSON's string escapes (\\ \" \n \uXXXX ...) are TOML's too; TOML also wants DEL escaped
    return json.dumps(str(value), ensure_ascii=False).replace("\x7f", "\\u007f")


def dumps(schedule: Schedule) -> str:
    """The schedule as a TOML file; ``loads(dumps(s), name=s.name)`` equals ``s`` (for a
    schedule loaded from a file, source aside)."""
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
