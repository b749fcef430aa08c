"""The repository is the product: no file names a path of the machine it was written on, an
issue number of this project's tracker, or a label of a round of work (a session, a visit
by number).  Commits are cited by hash instead."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SELF = Path(__file__).resolve().relative_to(ROOT).as_posix()

PATTERNS = {
    "an absolute machine path": r"(?<![\w.~-])/(?:work|root|home)/",
    "an issue number": r"\bissues? #?\d+\b|(?<![\w&#\"'])#\d{1,5}\b(?![\w\"'])",
    "a round label": r"\bsessions? \d+\b|\bs\d{1,2}/|\bs\d{2} v\d+\b|\bround \d+\b"
                     r"|\bvisit \d+\b",
}
FOUND = re.compile("|".join(f"(?P<k{i}>{p})" for i, p in enumerate(PATTERNS.values())),
                   re.IGNORECASE)


def _tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if out.returncode == 0 and out.stdout:
        return out.stdout.split()
    return [p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*")
            if p.is_file() and ".git" not in p.parts]


def findings(text: str) -> list[tuple[int, str, str]]:
    names = list(PATTERNS)
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        for m in FOUND.finditer(line):
            kind = names[int(m.lastgroup[1:])]
            out.append((i, kind, m.group(0)))
    return out


def test_no_machine_paths_issue_numbers_or_round_labels():
    bad = []
    for f in _tracked():
        if f == SELF or not (ROOT / f).is_file():
            continue
        try:
            text = (ROOT / f).read_text()
        except UnicodeDecodeError:
            continue            # binary
        bad += [f"{f}:{i}: {kind}: {word!r}" for i, kind, word in findings(text)]
    assert not bad, "\n".join(bad)


def test_the_patterns_find_what_they_are_for():
    planted = ("the library at /work/main/.dev/x.so\n"
               "as issue 12 asks (see #40)\n"
               "results/s25/v1/ from session 26, round 3\n")
    kinds = [k for _, k, _ in findings(planted)]
    assert kinds.count("an absolute machine path") == 1
    assert kinds.count("an issue number") == 2
    assert kinds.count("a round label") >= 3
    # what is not one: a hex colour, a measurement round's index, a tensor name
    assert findings('color="#444", x #3 of 4? no: "rounds of 10", bkv16 s_q') == \
        [(1, "an issue number", "#3")]
