"""The README's Python API example runs as written (from the project root)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_readme_api_example_runs(monkeypatch, capsys):
    text = (ROOT / "README.md").read_text()
    section = text.split("## Python API", 1)[1].split("\n## ", 1)[0]
    (code,) = python_blocks(section)
    for step in ("load_schedule", "mlagen.build", "MlaInputs(", "mlagen.run", "reference"):
        assert step in code, step
    monkeypatch.chdir(ROOT)
    exec(compile(code, "README.md:Python API", "exec"), {"__name__": "readme"})
    out = capsys.readouterr().out
    assert "max |out - reference| =" in out and "kernel.so" in out


def test_public_api_has_docstrings():
    import mlagen

    for name in ("load_schedule", "check", "can_implement", "render", "generate", "build",
                 "runner", "run"):
        doc = getattr(mlagen, name).__doc__
        assert doc and len(doc.split()) >= 8, name
