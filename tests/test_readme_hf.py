"""The README's transformers example runs as written (and generates through mlagen)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("transformers", minversion="5.0")

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_transformers_example(capsys):
    text = README.read_text()
    m = re.search(r"<!-- readme-hf-example[^>]*-->\s*```python\n(.*?)```", text, re.S)
    assert m, "the README's transformers example is missing"
    scope: dict = {}
    exec(compile(m.group(1), "README.md", "exec"), scope)
    out, model = scope["out"], scope["model"]
    assert tuple(out.shape) == (2, 13)
    attn = model.model.layers[0].self_attn
    assert type(attn).__name__ == "MlagenAttention" and attn.decoder.last is not None
    assert "tensor(" in capsys.readouterr().out
