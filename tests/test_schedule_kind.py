"""``[target] kind`` names the backend; the key's old spelling ``name`` is still read, with
a one-line notice."""

from __future__ import annotations

import pytest

from mlagen.errors import ScheduleError
from mlagen.schedule import dumps, loads

OLD = '[target]\nname = "sc11"\n\n[schedule]\nblock_kv = 48\n'


def test_old_key_is_read_with_a_one_line_notice(capsys):
    s = loads('[target]\nname = "hopper"\n', source="old.toml")
    assert s.target.kind == "hopper" and s.target.name == "hopper"
    err = capsys.readouterr().err
    assert err == 'mlagen: old.toml:2: [target] name is deprecated; write kind = "hopper"\n'
    assert "kind = \"hopper\"" in dumps(s) and "\nname = " not in dumps(s)


def test_errors_point_at_the_old_key(capsys):
    with pytest.raises(ScheduleError) as info:
        loads('[target]\nname = "tpu"\n', source="old.toml")
    assert str(info.value).startswith("old.toml:2: unknown target 'tpu'")
    with pytest.raises(ScheduleError) as info:
        loads(OLD, source="old.toml")
    assert info.value.line == 5


def test_both_spellings_at_once_is_an_error():
    with pytest.raises(ScheduleError, match=r"old.toml:3: give kind only"):
        loads('[target]\nkind = "sc11"\nname = "sc11"\n', source="old.toml")


def test_new_key_says_nothing(capsys):
    loads('[target]\nkind = "sc11"\n', source="new.toml")
    assert capsys.readouterr().err == ""
