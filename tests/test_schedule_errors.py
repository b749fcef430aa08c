"""Every malformed schedule under tests/schedules/bad/ fails with the message and line its
first line promises:  ``# expect: LINE: MESSAGE``  (``...`` in MESSAGE stands for any text,
e.g. an absolute path)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mlagen.errors import ResourceError, ScheduleError
from mlagen.schedule import load, loads

BAD = Path(__file__).parent / "schedules" / "bad"
FILES = sorted(BAD.glob("*.toml"))
_EXPECT = re.compile(r"^# expect: (\d+): (.+)$")


def _expectation(path: Path) -> tuple[int, re.Pattern]:
    first = path.read_text().splitlines()[0]
    m = _EXPECT.match(first)
    assert m, f"{path.name}: first line must be '# expect: LINE: MESSAGE', got {first!r}"
    pattern = ".*".join(re.escape(part) for part in m.group(2).split("..."))
    return int(m.group(1)), re.compile(pattern)


def test_enough_bad_schedules():
    assert len(FILES) >= 30


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_bad_schedule(path: Path):
    line, message = _expectation(path)
    with pytest.raises(ScheduleError) as info:
        load(str(path))
    e = info.value
    assert e.file == str(path)
    assert e.line == line, f"line {e.line}, expected {line}: {e.message}"
    assert message.fullmatch(e.message), f"message {e.message!r}"
    # what a user sees: file:line: message
    assert str(e) == f"{path}:{line}: {e.message}"


@pytest.mark.parametrize("path", [p for p in FILES if "overflow" in p.stem],
                         ids=lambda p: p.stem)
def test_resource_overflow_is_a_resource_error(path: Path):
    with pytest.raises(ResourceError) as info:
        load(str(path))
    found = re.findall(r"needs (\d+) (.+?) but the target has (\d+)", info.value.message)
    assert found, info.value.message
    for needed, _, available in found:
        assert int(needed) > int(available)


def test_missing_schedule_file_names_the_file(tmp_path):
    path = tmp_path / "nowhere.toml"
    with pytest.raises(ScheduleError) as info:
        load(path)
    assert info.value.file == str(path)
    assert "cannot read schedule: No such file or directory" in str(info.value)


def test_empty_file_needs_a_target():
    with pytest.raises(ScheduleError, match=r'\[target\] needs kind = "hopper" or "sc11"'):
        loads("", source="empty.toml")


def test_builder_errors_have_no_line():
    """A schedule made in Python has no file: the message says <schedule> and no line."""
    from mlagen.schedule import Schedule

    with pytest.raises(ScheduleError) as info:
        Schedule.build(target="sc11", page_size=64, block_kv=48)
    assert info.value.line is None
    assert str(info.value) == ("<schedule>: block_kv = 48 must divide page_size = 64 "
                               "or be a multiple of it")
    with pytest.raises(ScheduleError, match="unknown key 'blok_kv' in \\[schedule\\]; "
                                            "did you mean 'block_kv'"):
        Schedule.build(target="sc11", blok_kv=32)


def test_every_rule_is_exercised_by_a_bad_file(monkeypatch):
    """Each rule function (rules.py's and every backend's) is the one that rejects at least
    one bad file, so a new rule without a bad example shows up here."""
    from mlagen.backends import all_backends
    from mlagen.schedule import rules

    fired: set[str] = set()

    def spy(r):
        def watched(s, t):
            for violation in r(s, t):
                fired.add(r.__name__)
                yield violation
        return watched

    names = {r.__name__ for r in rules.RULES}
    monkeypatch.setattr(rules, "RULES", [spy(r) for r in rules.RULES])
    for b in all_backends():
        own = list(b.rules())
        names |= {r.__name__ for r in own}
        monkeypatch.setattr(b, "rules", lambda own=own: [spy(r) for r in own])
    for path in FILES:
        with pytest.raises(ScheduleError):
            load(str(path))
    assert names - fired == set(UNREACHABLE_FROM_FILES)


# rules no shipped target can break from a file (test_the_attention_rule_... checks them)
# (every target has dense and sparse kernels and reads every KV format)
UNREACHABLE_FROM_FILES = {"attention_supported", "kv_format_supported"}


def test_the_attention_rule_refuses_a_kind_the_target_lacks(monkeypatch):
    from mlagen.backends import backend
    from mlagen.schedule import Schedule

    monkeypatch.setattr(type(backend("sc11")), "attentions", ("dense",))
    with pytest.raises(ScheduleError, match="attention = 'sparse': target sc11 has dense "
                                            "kernels"):
        Schedule.build(target="sc11", heads=32, attention="sparse", topk=64, causal=False)


def test_the_format_rule_refuses_a_format_the_target_lacks(monkeypatch):
    from mlagen.backends import backend
    from mlagen.schedule import Schedule

    monkeypatch.setattr(type(backend("hopper")), "kv_formats", ("bf16", "fp16"))
    with pytest.raises(ScheduleError, match="kv_format = 'fp8_e4m3': target hopper reads "
                                            "bf16, fp16 caches"):
        Schedule.build(target="hopper", heads=32, kv_format="fp8_e4m3")


def test_positions_follow_toml_structure():
    """Lines of tables and keys where a line-by-line regex would be fooled."""
    from mlagen.schedule.parse import _positions

    text = "\n".join([
        '# [schedule] in a comment is not a table',          # 1
        'problem = { heads = 16, "page_size" = 32 }',        # 2
        '[target]  # trailing comment',                      # 3
        "name = 'sc11' # block_kv = 1",                      # 4
        'file = "a#b.toml"',                                  # 5
        '[ schedule ]',                                      # 6
        'split_kv = [',                                      # 7
        '  { buffers = 9 },',                                # 8
        ']',                                                 # 9
        'scheme = """',                                      # 10
        'tp = 99',                                           # 11
        '"""',                                               # 12
        'tp = 2',                                            # 13
        'cores.x = 1',                                       # 14
    ]) + "\n"
    pos = _positions(text)
    assert pos[("problem", None)] == 2 and pos[("problem", "heads")] == 2
    assert pos[("problem", "page_size")] == 2
    assert pos[("target", None)] == 3 and pos[("target", "name")] == 4
    assert pos[("target", "file")] == 5
    assert pos[("schedule", None)] == 6 and pos[("schedule", "split_kv")] == 7
    assert pos[("schedule", "scheme")] == 10 and pos[("schedule", "tp")] == 13
    assert pos[("schedule", "cores")] == 14
    assert ("schedule", "block_kv") not in pos and ("schedule", "buffers") not in pos


def _any_value():
    from hypothesis import strategies as st

    return st.one_of(st.integers(-3, 5000), st.sampled_from([0, 1, 2, 16, 64, 512]),
                     st.floats(allow_nan=True, allow_infinity=True), st.booleans(),
                     st.sampled_from(["auto", "bf16", "fp16", "seq", "wgmma", "", "x"]),
                     st.lists(st.integers(0, 9), max_size=2))


def test_arbitrary_values_give_schedule_errors_not_crashes():
    """Any value for any key, on either target: a schedule or a ScheduleError, nothing else
    (a rule must not divide by a zero an earlier rule already rejected)."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from mlagen.schedule.parse import TABLES, _toml_value

    keys = [(t, f) for t, r in TABLES.items() for f in r.__dataclass_fields__ if t != "target"]

    def toml(v):
        return "[" + ", ".join(map(str, v)) + "]" if isinstance(v, list) else _toml_value(v)

    @settings(max_examples=300, deadline=None)
    @given(st.sampled_from(["sc11", "hopper"]),
           st.dictionaries(st.sampled_from(keys), _any_value(), max_size=4))
    def check(target, knobs):
        lines = [f'[target]\nkind = "{target}"']
        for table in ("problem", "schedule"):
            lines.append(f"[{table}]")
            lines += [f"{k} = {toml(v)}" for (t, k), v in knobs.items() if t == table]
        try:
            loads("\n".join(lines) + "\n", source="fuzz.toml")
        except ScheduleError as e:
            assert e.file == "fuzz.toml" and e.line is not None, str(e)

    check()


def test_positions_match_generated_toml():
    """Random TOML documents (tables, dotted keys, inline tables, multi-line arrays and
    strings, comments, strings holding '#', '=', quotes and newlines): every table and key
    is found at the line it was written on."""
    import tomllib

    from hypothesis import given, settings
    from hypothesis import strategies as st

    from mlagen.schedule.parse import _positions, _toml_value

    names = st.sampled_from(["heads", "tp", "block_kv", "a", "b-c", "x_1"])
    text = st.text(st.sampled_from('ab#=[]{}"\'\\\n\t ,.'), max_size=8)
    scalar = st.one_of(st.one_of(st.integers(-9, 99), st.booleans(), text).map(_toml_value),
                       st.just("1979-05-27T07:32:00"), st.just("6.5e-3"))

    def lines_of(kind: int, key: str, value: str) -> list[str]:
        """One key written one of five ways; returns its lines (the key is on the first)."""
        if kind == 0:
            return [f"{key} = {value}  # {key} = 1 [t]"]
        if kind == 1:
            return [f"{key} = [", f"  {value},", "  # k = 2", f"  {value}", "]"]
        if kind == 2:
            return [f'{key} = """', f"{key} = 3", '[not.a.table]"""']
        if kind == 3:
            return [f"{key} = {{ inner = {value}, other = [1, 2] }}"]
        return [f"{key} = '''", "x = 4''' # done"]

    @settings(max_examples=150, deadline=None)
    @given(st.lists(st.tuples(st.sampled_from(["problem", "target", "schedule", "z"]),
                              st.lists(st.tuples(st.integers(0, 4), names, scalar),
                                       max_size=4, unique_by=lambda kv: kv[1])),
                    max_size=4, unique_by=lambda t: t[0]))
    def check(tables):
        out: list[str] = ["# generated"]
        want = {}
        for table, keys in tables:
            out += ["", f"[ {table} ]  # header"]
            want[(table, None)] = len(out)
            for kind, key, value in keys:
                want[(table, key)] = len(out) + 1
                out += lines_of(kind, key, value)
        doc = "\n".join(out) + "\n"
        tomllib.loads(doc)                     # the generator writes valid TOML
        got = _positions(doc)
        for where, line in want.items():
            assert got.get(where) == line, (where, doc)

    check()
