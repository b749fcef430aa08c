"""mlagen.backends.hopper.sass_loops: a kernel's register regions and loops read from
cuobjdump's SASS (the parser on text; the whole tool where nvcc and cuobjdump are)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from mlagen.backends.hopper import sass_loops

ROOT = Path(__file__).resolve().parent.parent


def _sass(body: list[str], name: str = "_Z6kernelv") -> str:
    lines = [f"\t\tFunction : {name}", "\t.headerflags\t@\"EF_CUDA_SM90\""]
    lines += [f"        /*{16 * i:04x}*/                   {t} ;  /* 0x000fe20000000f00 */"
              for i, t in enumerate(body)]
    return "\n".join(lines) + "\n"


def _kernel():
    body = ["MOV R1, c[0x0][0x28]", "USETMAXREG.DEALLOC.CTAPOOL 0x58"]
    head = len(body)                                   # the producer's loop from here
    body += ["LDG.E.64.CONSTANT R4, desc[UR4][R2.64]", "F2FP.F16.E4M3.UNPACK_B R6, R4"] * 30
    body += [f"@!P2 BRA {16 * head:#x}"]              # its back edge: 61 instructions
    body += ["USETMAXREG.TRYALLOC.CTAPOOL P0, 0xf0"]
    inner = len(body)
    body += ["HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT", "FMUL R8, R8, R9"] * 3
    body += [f"@P0 BRA {16 * inner:#x}"]              # 7 instructions: under --min
    body += ["EXIT"]
    stub = len(body)
    body += ["SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R2", f"@!P0 BRA {16 * stub:#x}",
             f"BRA {16 * (head + 3):#x}"]              # a slow path's return: not a loop
    body += [f"BRA {16 * len(body):#x}"]               # the trap after the body
    return body, head


def test_the_parser_finds_regions_and_loops_and_passes_over_slow_paths():
    body, head = _kernel()
    [k] = sass_loops.parse(_sass(body))
    assert k.instructions == len(body)
    assert k.regions == [(16, 0x58), (16 * (head + 61), 0xf0)]
    [loop] = k.loops
    assert (loop.start, loop.instructions, loop.region) == (16 * head, 61, 0x58)
    assert loop.mix["LDG"] == 30 and loop.mix["F2FP"] == 30 and loop.mix["BRA"] == 1
    # a lower --min lists the consumer's short loop too, in its own region
    short = sass_loops.parse(_sass(body), min_span=5)[0].loops
    assert [(lp.instructions, lp.region) for lp in short] == [(61, 0x58), (7, 0xf0)]


def test_two_functions_and_opcodes():
    a, _ = _kernel()
    ks = sass_loops.parse(_sass(a, "_Z1av") + _sass(["NOP", "EXIT"], "_Z1bv"))
    assert [k.name for k in ks] == ["_Z1av", "_Z1bv"]
    assert ks[1].loops == [] and ks[1].regions == []
    assert sass_loops.opcode("@!UP1 LDG.E.64.CONSTANT R4, desc[UR4][R2.64]") == "LDG"
    assert sass_loops.opcode("@PT BRA.U.ANY 0x1a00") == "BRA"
    lines = sass_loops.report("s", ks, 2)
    assert lines[0].startswith("s  _Z1av  ") and "registers: 88 from 0x10, 240 from" in lines[1]
    assert "61 instructions (after setmaxnreg 88): LDG 30, F2FP 30" in lines[2]


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    assert sass_loops.main([str(tmp_path / "missing.toml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("sass_loops: ")
    assert sass_loops.main(["--min", "1", str(ROOT / "schedules" / "hopper_wgmma.toml")]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


@pytest.mark.nvcc
def test_a_non_hopper_schedule_is_refused(capsys):
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc")
    try:
        sass_loops.find_cuobjdump()
    except sass_loops.Refused:
        pytest.skip("needs cuobjdump")
    assert sass_loops.main([str(ROOT / "schedules" / "sc11_attn.toml")]) == 2
    assert "not a Hopper schedule" in capsys.readouterr().err


@pytest.mark.nvcc
def test_the_64_row_kernel_has_its_three_regions_and_a_producer_loop(capsys):
    try:
        sass_loops.find_cuobjdump()
    except sass_loops.Refused:
        pytest.skip("needs cuobjdump")
    sched = str(ROOT / "schedules" / "hopper_fp8_e4m3_r64.toml")
    assert sass_loops.main(["--kernel", "Lb1", sched]) == 0
    out = capsys.readouterr().out
    assert "registers: 88 from" in out and "176 from" in out and "240 from" in out
    producer = [ln for ln in out.splitlines() if "(after setmaxnreg 88)" in ln]
    assert producer and all("F2FP" in ln for ln in producer)
