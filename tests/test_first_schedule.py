"""docs/first-schedule.md runs as written: its TOML blocks (first line `# FILE`) are written
into an empty folder, each `$ mlagen ...` line of its console blocks runs there, and every
output line shown under a command must be in what it printed (a command marked
`# exit status N` must exit with N, else 0)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "first-schedule.md"


def blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def steps(text: str) -> list[tuple[str, int, list[str]]]:
    """(command, exit status, expected lines) for each `$ ` line of the console blocks."""
    out = []
    for block in blocks(text, "console"):
        for line in block.splitlines():
            if line.startswith("$ "):
                cmd, _, note = line[2:].partition("#")
                m = re.search(r"exit status (\d+)", note)
                out.append((cmd.strip(), int(m.group(1)) if m else 0, []))
            elif line.strip():
                out[-1][2].append(line)
    return out


def test_the_page_has_every_step():
    cmds = [c for c, _, _ in steps(PAGE.read_text())]
    for verb in ("check", "verify", "run"):
        assert any(c.startswith(f"mlagen {verb} ") for c in cmds), verb
    assert len(blocks(PAGE.read_text(), "toml")) >= 2


def test_first_schedule_page_runs_as_written(tmp_path):
    text = PAGE.read_text()
    for block in blocks(text, "toml"):
        name = block.splitlines()[0].removeprefix("# ").strip()
        (tmp_path / name).write_text(block)
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for cmd, status, expected in steps(text):
        argv = shlex.split(cmd)
        assert argv[0] == "mlagen"
        proc = subprocess.run([sys.executable, "-m", "mlagen.cli", *argv[1:]], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=600)
        said = proc.stdout + proc.stderr
        assert proc.returncode == status, f"{cmd}: exit {proc.returncode}\n{said}"
        lines = [ln.rstrip() for ln in said.splitlines()]
        for want in expected:
            assert any(want.rstrip() in ln for ln in lines), f"{cmd}: no line {want!r}\n{said}"
