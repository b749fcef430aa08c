"""The SC11 emulator: runtime protocol checks, trace layout and invariants, dry mode,
determinism, capacity accounting, input validation, planted faults."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from mlagen.backends import sc11
from mlagen.backends.sc11 import tracecheck
from mlagen.backends.sc11.trace import EVENT_DTYPE, Engine, Mem, Op
from mlagen.errors import EmulatorError, InputError, ScheduleError
from mlagen.paths import TEMPLATES_DIR
from mlagen.problem import make_inputs
from mlagen.schedule.records import BASIC_FAULTS, FAULTS, Schedule
from mlagen.backends.sc11.resources import sc11_layout
from mlagen.backends import load_target

from mlagen import reference

RUNTIME = TEMPLATES_DIR / "sc11" / "runtime"
HERE = Path(__file__).parent

# a small attention variant and a small fused one (real DeepSeek ranks, few heads)
ATTN = dict(target="sc11", heads=16, tp=2, page_size=16, dtype="bf16", fused=False, cores=4,
            block_kv=16, buffers=2, seq_tile=64, max_s_q=2)
FUSED = dict(ATTN, fused=True, heads=8, tp=1, q_lora_rank=256)


@pytest.fixture(scope="module")
def attn():
    return sc11.runner(Schedule.build(name="attn", **ATTN))


@pytest.fixture(scope="module")
def fused():
    return sc11.runner(Schedule.build(name="fused", **FUSED))


def inputs(s: Schedule, lens, s_q=2, seed=0):
    return make_inputs(s.problem, len(lens), lens, s_q=s_q, heads=s.heads_per_device, seed=seed)


def _ref(inp):
    """The project's reference in float64."""
    return reference.run(inp, dtype=torch.float64)


def close(out, r, fused=False):
    """bf16-level agreement.  Attention-only: the inputs are exact bf16 values, so lse (fp32
    math) agrees closely and out to its own rounding; fused: q is rounded to bf16 after the
    projection (as on the card), so both carry that error."""
    o, l = out.out.double(), out.lse.double()
    ro, rl = r.out.double(), r.lse.double()
    out_tol, lse_tol = (3e-2, 3e-2) if fused else (1e-2, 1e-3)
    assert torch.isfinite(o).all()
    assert (o - ro).abs().max().item() <= out_tol * max(1.0, ro.abs().max().item())
    assert torch.equal(torch.isinf(l), torch.isinf(rl))
    fin = torch.isfinite(rl)
    if fin.any():
        assert (l[fin] - rl[fin]).abs().max().item() <= lse_tol


# ------------------------------------------------------------------ runtime, alone ------
def test_runtime_protocol_checks_standalone(tmp_path):
    """machine.h compiles on its own and raises on every protocol / capacity violation."""
    exe = tmp_path / "protocol"
    cxx = shutil.which("c++") or shutil.which("g++")
    subprocess.run([cxx, "-std=c++17", "-O1", "-pthread", f"-I{RUNTIME}",
                    str(HERE / "sc11_protocol_check.cpp"), "-o", str(exe)], check=True)
    proc = subprocess.run([str(exe)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("caught ") == 9 and "legal order ok" in proc.stdout
    assert "capacity exceeded" in proc.stdout and "in use" in proc.stdout
    # a read of the slot the next DMA is filling raises, by address
    assert "caught read_of_slot_being_filled_by_address: core 0: read of slot[1]" in proc.stdout
    assert "being filled" in proc.stdout


@pytest.mark.parametrize("header", ["trace.h", "machine.h", "numeric.h", "plan.h", "abi.h",
                                    "mla.h"])
def test_runtime_headers_compile_on_their_own(header):
    cxx = shutil.which("c++") or shutil.which("g++")
    proc = subprocess.run([cxx, "-std=c++17", "-fsyntax-only", "-Wall", "-Wextra", "-Werror",
                           f"-I{RUNTIME}", "-x", "c++", "-"], input=f'#include "{header}"\n',
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_trace_header_matches_event_dtype():
    """trace.h lists the fields of EVENT_DTYPE in the same order with the same widths."""
    text = (RUNTIME / "trace.h").read_text()
    body = text[text.index("struct Event {"):text.index("};", text.index("struct Event {"))]
    fields = []
    for line in body.splitlines()[1:]:
        line = line.split("//")[0].strip().rstrip(";")
        if not line:
            continue
        ctype, names = line.split(None, 1)
        for n in names.split(","):
            n = n.strip()
            if "[" in n:
                n = n[:n.index("[")]
            fields.append((n, {"int64_t": 8, "int32_t": 4}[ctype]))
    assert [f for f, _ in fields] == list(EVENT_DTYPE.names)
    assert [w for _, w in fields][:-1] == [EVENT_DTYPE[n].itemsize for n in EVENT_DTYPE.names][:-1]


# ------------------------------------------------------------------ trace --------------
@pytest.mark.parametrize("scheme", ["heads", "batch", "seq", "batch_seq"])
def test_trace_invariants_and_dry_mode(attn, scheme):
    s = attn.schedule
    inp = inputs(s, [0, 1, 17, 150, 64])
    out = attn(inp, scheme=scheme)
    tr = out.extra["trace"]
    assert tr.dtype == EVENT_DTYPE and len(tr) > 0
    assert tracecheck.check(tr, s.mapping.buffers, s.problem.d) == []
    # dry mode: the very same trace, no data work
    dry = attn.dry_run(inp, scheme)
    assert np.array_equal(dry, tr)
    # every engine did something; SDMA only between DDR and L2
    sd = tr[tr["engine"] == Engine.SDMA]
    assert len(sd) and set(sd["src"]) == {Mem.DDR} and set(sd["dst"]) == {Mem.L2}
    assert (tr["engine"] == Engine.BDC).any() and (tr["engine"] == Engine.GDMA).any()
    # bytes gathered by SDMA: exactly the visible keys (NaN slots never fetched)
    lens = inp.cache_seqlens.long()
    per_core_heads = -(-s.heads_per_device // s.mapping.cores)
    cores_busy = -(-s.heads_per_device // per_core_heads) if scheme == "heads" else 1
    # "heads": every busy core reads all of the KV
    assert int(sd["bytes"].sum()) == int(lens.sum()) * s.problem.d * 2 * cores_busy
    close(out, _ref(inp))


def test_trace_deterministic_over_threads(fused):
    s = fused.schedule
    inp = inputs(s, [5, 130, 0, 64, 33, 200, 1, 90, 16], s_q=1, seed=3)
    a = fused(inp, scheme="batch_seq", threads=1)
    b = fused(inp, scheme="batch_seq", threads=2)
    assert np.array_equal(a.extra["trace"], b.extra["trace"])
    assert torch.equal(a.out, b.out) and torch.equal(a.lse, b.lse)
    assert tracecheck.check(a.extra["trace"], s.mapping.buffers, s.problem.d) == []
    # phases A, B, (merge), C with barriers between them
    tr = a.extra["trace"]
    assert set(np.unique(tr["phase"])) >= {0, 1, 2, 4}
    assert (tr["op"] == Op.BARRIER).sum() % s.mapping.cores == 0


def test_buffers_one_has_no_overlap_and_two_overlaps(attn):
    got = {}
    for nbuf in (1, 2, 3):
        r = attn if nbuf == attn.schedule.mapping.buffers else \
            sc11.runner(Schedule.build(name="attn", **dict(ATTN, buffers=nbuf)))
        inp = inputs(r.schedule, [300, 200], s_q=1)
        tr = r(inp, scheme="batch").extra["trace"]
        hb = tracecheck.HappensBefore(tr)
        st = tracecheck.phase_b_steps(tr, 0, r.schedule.problem.d * 2)
        assert len(st.sdma) >= 4
        assert tracecheck.check_buffers(tr, nbuf, r.schedule.problem.d, hb) == []
        # can the gather of step k+1 run while step k computes?
        got[nbuf] = [not hb.before(st.bdc_last[k], st.sdma[k + 1])
                     for k in range(len(st.sdma) - 1)]
    assert not any(got[1])          # one buffer: strictly one step after another
    assert all(got[2]) and all(got[3])


# ------------------------------------------------------------------ capacities ---------
@pytest.mark.parametrize("which", ["attn", "fused"])
def test_high_water_marks_match_the_schedule_check(which, attn, fused):
    r = attn if which == "attn" else fused
    s = r.schedule
    t = load_target("sc11")
    lay = sc11_layout(s, t)
    out = r(inputs(s, [40, 3], s_q=s.problem.max_s_q), scheme="seq")
    assert out.extra["lmem_high"] == lay["lmem"] <= t.lmem_bytes
    assert out.extra["l2_static"] == lay["l2"]
    assert lay["l2"] <= out.extra["l2_high"] <= t.l2_bytes
    if not s.problem.fused:   # batch-dependent L2: the split partials only
        parts = out.extra["n_parts"]
        assert parts > 0
        assert out.extra["l2_high"] - lay["l2"] == -(-parts * s.heads_per_device * 2
                                                     * (s.problem.dv + 1) * 4 // 256) * 256


def test_schedule_check_rejects_what_does_not_fit():
    with pytest.raises(ScheduleError, match="LMEM"):
        Schedule.build(**dict(ATTN, seq_tile=16384, buffers=3))


def test_l2_overflow_at_run_time_is_an_emulator_error(tmp_path):
    text = (Path(load_target("sc11").path)).read_text()
    small = tmp_path / "sc11_small_l2.toml"
    # 1 MiB of L2: the static KV slots fit, a large batch's split partials do not
    small.write_text(text.replace("value = 134217728", "value = 1048576"))
    s = Schedule.build(target_file=str(small), **dict(ATTN, seq_tile=16))
    r = sc11.runner(s)
    with pytest.raises(EmulatorError, match="L2 capacity exceeded"):
        r(inputs(s, [200] * 16, s_q=1), scheme="seq")
    r(inputs(s, [200] * 2, s_q=1), scheme="batch")   # and a small one runs


# ------------------------------------------------------------------ inputs -------------
def test_input_validation(attn, fused):
    s = attn.schedule
    good = inputs(s, [10, 20])
    attn(good)
    bad = [
        dataclasses.replace(good, q=good.q.half()),                               # dtype
        dataclasses.replace(good, q=good.q[:, :, :4]),                            # heads
        dataclasses.replace(good, q=torch.cat([good.q] * 2, 1)[:, :3]),           # s_q > max
        dataclasses.replace(good, block_table=good.block_table.long()),           # index dtype
        dataclasses.replace(good, cache_seqlens=torch.tensor([10, 10_000], dtype=torch.int32)),
        dataclasses.replace(good, k_cache=good.k_cache[:, :8]),                   # page size
        dataclasses.replace(good, softmax_scale=-1.0),
    ]
    t2 = good.block_table.clone()
    t2[1, 0] = good.k_cache.shape[0]
    bad.append(dataclasses.replace(good, block_table=t2))                         # page index
    for b in bad:
        with pytest.raises(InputError):
            attn(b)
    with pytest.raises(InputError):
        fused(good)                                                               # q, not q_lora
    with pytest.raises(InputError):
        attn(good, scheme="diagonal")


def test_a_wrong_rank_tensor_is_named_by_its_shape(attn, fused):
    good = inputs(attn.schedule, [10, 20])
    q3 = good.q[:, 0]                                     # [b, h, d]: s_q left out
    with pytest.raises(InputError, match=r"q has shape \(2, 8, 576\); expected "
                                         r"\[batch, s_q, 8, 576\]") as info:
        attn(dataclasses.replace(good, q=q3))
    assert "-1" not in str(info.value)
    with pytest.raises(InputError, match=r"k_cache has shape \(\d+, 16, 576\)"):
        attn(dataclasses.replace(good, k_cache=good.k_cache[:, :, 0]))
    with pytest.raises(InputError, match=r"block_table has shape \(\d+,\); expected"):
        attn(dataclasses.replace(good, block_table=good.block_table.flatten()[:8]))
    fin = inputs(fused.schedule, [10, 20])
    with pytest.raises(InputError, match=r"q_lora has shape \(2, 256\); expected "
                                         r"\[batch, s_q, 256\]"):
        fused(dataclasses.replace(fin, q_lora=fin.q_lora[:, 0]))


# ------------------------------------------------------------------ faults -------------
@pytest.mark.parametrize("scheme", ["batch", "seq"])
def test_unfaulted_variant_passes_the_fault_inputs(scheme):
    """The fault tests' inputs and tolerance pass without a fault (so a failure is the fault)."""
    s = Schedule.build(name="attn", **ATTN)
    inp = inputs(s, [37, 150, 5, 64], s_q=2, seed=11)
    close(sc11.runner(s)(inp, scheme=scheme), _ref(inp))


@pytest.mark.parametrize("fault", BASIC_FAULTS)
def test_planted_fault_is_caught(fault):
    s = Schedule.build(name="attn", **ATTN).with_fault(fault)
    r = sc11.runner(s)
    inp = inputs(s, [37, 150, 5, 64], s_q=2, seed=11)
    scheme = "seq" if fault == "bad_split_merge" else "batch"
    try:
        out = r(inp, scheme=scheme)
    except EmulatorError as e:
        assert fault == "early_buffer_swap", e
        return
    assert fault != "early_buffer_swap", "the protocol check missed an early buffer swap"
    with pytest.raises(AssertionError):
        close(out, _ref(inp))


# ------------------------------------------------------------------ trace bytes ---------
@pytest.mark.parametrize("which,scheme", [("attn", "seq"), ("fused", "batch_seq")])
def test_trace_bytes_are_the_bytes_the_copies_moved(which, scheme, attn, fused):
    """Every DMA event's byte count comes from its copies (Core::Copy): the trace's DMA
    bytes add up to what the copies really moved, on the real run."""
    r = attn if which == "attn" else fused
    inp = inputs(r.schedule, [37, 150, 0, 64, 5], s_q=2, seed=3)
    out = r(inp, scheme=scheme)
    tr = out.extra["trace"]
    dma = tr[tr["op"] == Op.DMA]
    assert out.extra["copied_bytes"] > 0
    assert int(dma["bytes"].sum()) == out.extra["copied_bytes"]
    # and the dry trace (no copies) is the same trace
    assert np.array_equal(r.dry_run(inp, scheme), tr)


def test_kernel_moves_data_only_through_counted_copies():
    """mla.h has no raw copy and no DMA event written by hand: every DMA goes through
    Core::Copy and Core::dma, which take the byte count from the copies."""
    text = (RUNTIME / "mla.h").read_text()
    assert "memcpy" not in text
    assert "emit(SDMA" not in text and "emit(GDMA" not in text
    assert "OP_DMA" not in text


# ------------------------------------------------------------------ happens-before ------
def _cut(tr, sel, n=0):
    """The trace with every dependency of the n-th event matching `sel` removed."""
    t = tr.copy()
    i = int(np.nonzero(sel(t))[0][n])
    t["deps"][i] = -1
    return t


def test_happens_before_checks_cover_phases_a_c_merge_and_barriers(fused):
    s = fused.schedule
    inp = inputs(s, [300, 7, 90], s_q=2, seed=2)
    tr = fused.dry_run(inp, "seq")                  # split sequences: the merge runs
    assert (tr["phase"] == 3).any()
    d, nb = s.problem.d, s.mapping.buffers
    assert tracecheck.check(tr, nb, d) == []
    mm = lambda ph: lambda t: (t["phase"] == ph) & (t["op"] == Op.MATMUL)   # noqa: E731
    cases = {
        "phase 1": _cut(tr, mm(1), 2),              # an A matmul no longer waits its weights
        "phase 4": _cut(tr, mm(4), 2),              # a C matmul no longer waits its inputs
        "merge": _cut(tr, lambda t: (t["phase"] == 3) & (t["engine"] == Engine.BDC)),
        "segment": _cut(tr, lambda t: (t["engine"] == Engine.BARRIER) & (t["core"] == 1)),
    }
    for where, bad in cases.items():
        errs = tracecheck.check(bad, nb, d)
        assert any(where in e for e in errs), (where, errs[:3])
