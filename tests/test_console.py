"""mlagen.console: tables (rich on a terminal, markdown otherwise), sizes, wait feedback."""

from __future__ import annotations

import io

from mlagen.console import human_bytes, markdown_table, progress_rows, status, table


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_table_is_rich_on_a_terminal_and_markdown_otherwise():
    cols, rows = ("resource", "needed"), [("LMEM per core", "7.0 MiB")]
    tty, plain = Tty(), io.StringIO()
    table(cols, rows, right=(1,), file=tty)
    table(cols, rows, right=(1,), file=plain)
    assert "┃" in tty.getvalue() and "LMEM per core" in tty.getvalue()
    assert plain.getvalue() == markdown_table(cols, rows, right=(1,)) + "\n"
    assert plain.getvalue().splitlines()[1] == "|---|---:|"


def test_human_bytes():
    assert [human_bytes(n) for n in (0, 1023, 1024, 7340032, 2 ** 40)] == \
        ["0 B", "1023 B", "1.0 KiB", "7.0 MiB", "1.0 TiB"]


def test_waits_off_a_terminal_are_plain_lines(capsys):
    with status("mlagen: building x ...") as st:
        st.update("mlagen: building x: [1/2] c++ kernel.cpp")
        st.update("mlagen: building x: [1/2] c++ kernel.cpp")     # said once
    with status("quiet", enabled=False) as st:
        st.update("still quiet")
    with progress_rows(2, "grid") as advance:
        advance("row 1")
        advance("row 2")
    assert capsys.readouterr().err.splitlines() == [
        "mlagen: building x ...", "mlagen: building x: [1/2] c++ kernel.cpp", "row 1",
        "row 2"]
