"""benchmarks/anchors/vllm_fp8.py, the vLLM dense FP8 anchor's stage-and-build script: bad
input is one line and exit status 2 (its build runs on a GPU machine; see BENCHMARKS.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "anchors" / "vllm_fp8.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True,
                          text=True, timeout=120)


def test_build_refuses_a_folder_that_was_not_staged(tmp_path):
    p = _run("build", "--src", str(tmp_path))
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.strip().splitlines() == [p.stderr.strip()]
    assert "not a staged folder" in p.stderr and "Traceback" not in p.stderr


def test_stage_refuses_a_folder_that_is_not_a_repository(tmp_path):
    p = _run("stage", "--flashmla", str(tmp_path / "none"), "--cutlass", str(tmp_path),
             "--dest", str(tmp_path / "out"))
    assert p.returncode == 2 and "git archive 46d64a8 failed" in p.stderr
    assert "Traceback" not in p.stderr and not (tmp_path / "out" / "flashmla").exists()


FLASHMLA = SCRIPT.parent / "flashmla_sparse.py"


def test_flashmla_anchor_refuses_in_one_line(tmp_path):
    """The FlashMLA sparse anchor's script (the same staging helpers): a folder that was
    not staged, a mirror that is not a repository."""
    for args, words in ((("build", "--src", str(tmp_path), "--out", str(tmp_path / "o")),
                         "staged"),
                        (("stage", "--flashmla", str(tmp_path / "none"), "--cutlass",
                          str(tmp_path), "--dest", str(tmp_path / "out")),
                         "git archive 9241ae3")):
        p = subprocess.run([sys.executable, str(FLASHMLA), *args], capture_output=True,
                           text=True, timeout=120)
        assert p.returncode == 2 and p.stdout == "", p.stderr
        assert p.stderr.strip().splitlines() == [p.stderr.strip()]
        assert words in p.stderr and "Traceback" not in p.stderr
