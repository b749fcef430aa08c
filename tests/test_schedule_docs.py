"""docs/schedule-language.md keeps up with the records; its examples are legal schedules."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from mlagen.backends import all_backends
from mlagen.schedule import loads
from mlagen.schedule.records import Problem, TargetRef

DOC = Path(__file__).resolve().parents[1] / "docs" / "schedule-language.md"


def test_every_key_has_a_row():
    text = DOC.read_text()
    rows = set(re.findall(r"^\| `([a-z0-9_]+)` \|", text, flags=re.M))
    for record in (Problem, TargetRef, *(b.mapping for b in all_backends())):
        for f in dataclasses.fields(record):
            assert f.name in rows, f"{f.name} ({record.__name__}) is not documented"


def test_examples_load_and_pass_the_checks():
    blocks = re.findall(r"```toml\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) >= 2
    targets = {loads(block, source="docs example").target.kind for block in blocks}
    assert targets == {"sc11", "hopper"}
