"""What the CLI shows while it works and when it is done: spinners for waits, progress bars
for rows, tables, sizes.

On a terminal these are rich's (imported on first use: `mlagen --help` stays fast); when
stderr / stdout is a file or a pipe they fall back to plain lines and markdown tables, so
logs and scripts read the same text every time.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Callable, Iterator, Optional, Sequence

# Whether library calls (a build, a lock wait) report their waits on stderr by default:
# the CLI turns it on, a program importing mlagen keeps a quiet library.
PROGRESS = False


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB' (binary units, as memory is counted)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def _tty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class Status:
    """A waiting line that can be updated: a rich spinner on a terminal, plain lines on
    stderr otherwise (each new text once)."""

    def __init__(self, status=None):
        self._status = status
        self._last = None

    def update(self, text: str) -> None:
        if self._status is not None:
            self._status.update(text)
        elif text != self._last:
            print(text, file=sys.stderr, flush=True)
        self._last = text


@contextlib.contextmanager
def status(message: str, enabled: bool = True) -> Iterator[Status]:
    """``with status("building ...") as st: ... st.update("...")``: feedback for a wait
    that may last more than a second.  Disabled, it says nothing."""
    if not enabled:
        yield Status(_Silent())
        return
    if _tty(sys.stderr):
        from rich.console import Console

        with Console(stderr=True).status(message) as st:
            yield Status(st)
    else:
        s = Status()
        s.update(message)
        yield s


class _Silent:
    def update(self, text: str) -> None:
        pass


@contextlib.contextmanager
def progress_rows(total: int, description: str, bar: bool = True
                  ) -> Iterator[Callable[[str], None]]:
    """A progress bar over `total` rows on a terminal; yields ``advance(text)``, which
    moves it one row and shows `text` (the row just done).  Off a terminal, or without
    ``bar``, each row is a line on stderr."""
    if not (bar and _tty(sys.stderr)):
        yield lambda text: print(text, file=sys.stderr, flush=True)
        return
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeElapsedColumn)

    console = Console(stderr=True)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), TextColumn("{task.fields[row]}"), console=console,
                  transient=False) as bar:
        task = bar.add_task(description, total=total, row="")

        def advance(text: str) -> None:
            bar.console.print(text, highlight=False)
            bar.update(task, advance=1, row="")

        yield advance


def table(columns: Sequence[str], rows: Sequence[Sequence[str]], title: Optional[str] = None,
          right: Sequence[int] = (), whole: Sequence[int] = (), file=None) -> None:
    """Print a table: rich's box table on a terminal, a markdown table otherwise (what the
    benchmark files hold).  ``right``: indices of right-aligned (numeric) columns;
    ``whole``: columns never wrapped or cut (names to copy, e.g. cache keys)."""
    file = file or sys.stdout
    if _tty(file):
        from rich.console import Console
        from rich.table import Table

        t = Table(title=title, title_justify="left", header_style="bold")
        for i, c in enumerate(columns):
            t.add_column(c, justify="right" if i in right else "left",
                         no_wrap=i in whole, overflow="fold" if i in whole else "ellipsis")
        for r in rows:
            t.add_row(*[str(x) for x in r])
        Console(file=file).print(t)
        return
    print(markdown_table(columns, rows, title, right), file=file)


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[str]],
                   title: Optional[str] = None, right: Sequence[int] = ()) -> str:
    lines = [f"{title}\n"] if title else []
    lines.append("| " + " | ".join(columns) + " |")
    lines.append("|" + "".join("---:|" if i in right else "---|" for i in range(len(columns))))
    lines += ["| " + " | ".join(str(x) for x in r) + " |" for r in rows]
    return "\n".join(lines)
