"""`mlagen run --tp N`: a real multi-process run (gloo), heads split by rank, gathered and
checked against the reference of all heads; the SC11 TP step includes the o_proj all-reduce
over the card link."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mlagen.backends.sc11.collective import allreduce_seconds, tp_step
from mlagen.cli import main
from mlagen.backends import load_target

# the transformers integration's variant at tp = 2 (one build serves both tests)
SCHEDULE = """[problem]
heads = 8
kv_lora_rank = 512
rope_dim = 64
qk_nope_head_dim = 128
v_head_dim = 128
q_lora_rank = 1536
page_size = 16
dtype = "bf16"
max_s_q = 1
fused = true

[target]
name = "sc11"

[schedule]
tp = 1
cores = 8
scheme = "batch_seq"
block_kv = 16
buffers = 2
seq_tile = 512
"""


def test_allreduce_model():
    t = load_target("sc11")
    assert allreduce_seconds(1 << 20, 1, 1e9, 1e-6) == 0.0
    # ring: 2 (tp - 1) / tp of the bytes over one link, 2 (tp - 1) latencies
    assert allreduce_seconds(4000, 4, 1e9, 1e-6) == pytest.approx(6e-6 + 6e-6)
    step = tp_step([10e-6, 12e-6], tokens=4, target=t)
    assert step.allreduce_bytes == 4 * 7168 * 2
    assert step.total_s == pytest.approx(12e-6 + allreduce_seconds(57344, 2, 11.2e9, 0.25e-6))
    assert "ASSUMED" in step.summary()


def test_run_tp2(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(SCHEDULE)
    proc = subprocess.run([sys.executable, "-m", "mlagen.cli", "run", str(path), "--tp", "2",
                           "--batch", "3", "--seqlen", "40", "--varlen"],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "tp 2 ranks, 4 of 8 heads each" in proc.stdout
    assert "all 8 heads gathered from 2 ranks vs the reference: outputs match" in proc.stdout
    assert "o_proj all-reduce (ring)" in proc.stdout


def test_tp_that_does_not_divide_the_heads(tmp_path, capsys):
    path = tmp_path / "s.toml"
    path.write_text(SCHEDULE)
    assert main(["run", str(path), "--tp", "3"]) == 2
    err = capsys.readouterr().err
    assert "tp = 3 must divide heads = 8" in err and "Traceback" not in err


@pytest.mark.parametrize("tp,warned", [(4, True), (2, False)])
def test_more_ranks_than_cores_warns_once(tp, warned, tmp_path, capsys, monkeypatch):
    """--tp N beyond the cores still runs (same result, slower) but says so, once, before
    the ranks start."""
    from mlagen import parallel, tprun
    from mlagen.errors import MlagenError

    path = tmp_path / "s.toml"
    path.write_text(SCHEDULE)
    monkeypatch.setattr(tprun, "cpu_cores", lambda: 2)

    def stop(*a, **k):
        raise MlagenError("ranks would start here")
    monkeypatch.setattr(parallel, "spawn", stop)
    assert main(["run", str(path), "--tp", str(tp)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "mlagen: ranks would start here"
    warnings = [ln for ln in err if "warning" in ln]
    if warned:
        assert warnings == [f"mlagen: warning: --tp {tp} starts {tp} processes on 2 CPU cores; "
                            "the ranks take turns, so the run is slower than on a machine "
                            "with a core each"]
    else:
        assert warnings == []
