"""mlagen.backends.hopper.sass_same: a change to the Hopper headers that keeps every cubin section is
told apart from one that does not, without a GPU."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCHEDULE = str(ROOT / "schedules" / "hopper_wgmma.toml")


def _tool():
    from mlagen.backends.hopper import sass_same
    return sass_same


def _copy(tmp_path: Path) -> Path:
    tree = tmp_path / "base"
    for d in ("mlagen", "templates", "targets"):
        shutil.copytree(ROOT / d, tree / d, ignore=shutil.ignore_patterns("__pycache__"))
    return tree


@pytest.mark.nvcc
def test_an_unchanged_tree_is_the_same_and_a_changed_constant_is_not(tmp_path, capsys):
    tool = _tool()
    base = _copy(tmp_path)
    assert tool.main(["--base", str(base), SCHEDULE]) == 0
    assert "hopper_wgmma: same" in capsys.readouterr().out
    # a comment moves lines (no -lineinfo: still the same); a constant changes the code
    common = base / "templates" / "hopper" / "include" / "mla_common.cuh"
    text = common.read_text()
    assert "constexpr float kRescaleSlack = 8.f;" in text
    common.write_text("// a new first line\n" + text)
    assert tool.main(["--base", str(base), SCHEDULE]) == 0
    capsys.readouterr()
    common.write_text(text.replace("kRescaleSlack = 8.f;", "kRescaleSlack = 7.f;"))
    assert tool.main(["--base", str(base), SCHEDULE]) == 1
    out = capsys.readouterr().out
    assert "hopper_wgmma: DIFFERS in" in out and ".text." in out


def test_bad_bases_and_files_are_one_line_exit_2(tmp_path, capsys):
    tool = _tool()
    assert tool.main(["--base", "no-such-revision-or-folder", SCHEDULE]) in (2,)
    assert tool.main(["--base", str(tmp_path), SCHEDULE]) == 2
    assert tool.main(["--base", "HEAD", str(tmp_path / "missing.toml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("sass_same: ") for line in err), err
    with pytest.raises(ValueError, match="not a 64-bit"):
        tool.elf_sections(b"not an elf file")
