"""Where each key of a schedule file is, so a rule's message can name its line."""

from __future__ import annotations

import re

from ..errors import ScheduleError

Positions = dict[tuple[str, "str | None"], int]
TABLE_NAMES = ("problem", "target", "schedule")

_NAMED = re.compile(r"\b([a-z_]+) = ")


class Located:
    """Where each key of a schedule came from, so rules can point at a line."""

    def __init__(self, source: str | None, positions: Positions):
        self.source = source
        self.positions = positions

    def line_of(self, table: str, key: str | None, message: str = "") -> int | None:
        """The key's line; else the line of a key the message names (``page_size = 48``
        when the rule's own key kept its default); else the table's header."""
        if (table, key) in self.positions:
            return self.positions[(table, key)]
        for named in _NAMED.findall(message):
            for t in TABLE_NAMES:
                if (t, named) in self.positions:
                    return self.positions[(t, named)]
        return self.positions.get((table, None))

    def error(self, table: str, key: str | None, message: str,
              cls: type[ScheduleError] = ScheduleError) -> ScheduleError:
        return cls(message, file=self.source, line=self.line_of(table, key, message))
