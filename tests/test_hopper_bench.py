"""The Hopper benchmark of record without a GPU: its workloads are the anchor's (the token
counts reproduce the anchor's published TFLOPS and GB/s on every row), and its report."""

from __future__ import annotations

import inspect
import math

import pytest
import torch

from mlagen.backends.hopper import bench


def test_anchor_rows_and_graph_rows_are_all_there():
    assert len(bench.anchor_rows()) == 51
    assert len(bench.graph_rows()) == 8
    rows = bench.plan_rows()
    assert sum(r.kind == "anchor" for r in rows) == 51
    assert sum(r.kind == "graph" for r in rows) == 8


@pytest.mark.parametrize("row", bench.anchor_rows(), ids=lambda r: "b{b}_sq{s_q}_sk{sk}_h{h_q}_{varlen}"
                         .format(**r))
def test_lengths_reproduce_the_anchors_figures(row):
    """Our tokens are the anchor's: its TFLOPS and GB/s follow from our lengths and its ms
    (another generator gives 1.8-5.3% fewer tokens on varlen rows)."""
    lens = bench.seqlens_for(row["b"], row["s_q"], row["sk"], row["varlen"])
    flops, nbytes = bench.flops_bytes(row["b"], row["s_q"], row["h_q"], lens)
    assert flops / 1e9 / row["best_ms"] == pytest.approx(row["best_tflops"], rel=2e-3)
    assert nbytes / 1e6 / row["best_ms"] == pytest.approx(row["best_gbps"], rel=2e-3)


@pytest.mark.parametrize("page", [64, 16])
def test_workload_follows_the_recipe(page):
    q, k, bt, seqlens, lens = bench.workload(4, 2, 300, 16, True, device="cpu", page=page)
    assert lens == bench.seqlens_for(4, 2, 300, True) and min(lens) >= 2
    pad = math.ceil(max(lens) / 256) * 256
    assert bt.shape == (4, pad // page) and k.shape == (4 * pad // page, page, 1, 576)
    assert sorted(bt.flatten().tolist()) == list(range(k.shape[0]))      # a permutation
    assert q.shape == (4, 2, 16, 576) and q.dtype == torch.bfloat16
    assert seqlens.tolist() == lens
    again = bench.workload(4, 2, 300, 16, True, device="cpu", page=page)
    assert torch.equal(again[0], q) and torch.equal(again[2], bt)         # seed 0


def test_report_geomean_and_markdown():
    rows = bench.plan_rows()[:2] + [bench.plan_rows()[-1]]
    for r, ms in zip(rows, (0.2, 0.1, 0.05)):
        r.check, r.eager_ms, r.graph_ms, r.kernel_ms = "ok", ms, ms * 0.9, ms * 0.8
        if r.anchor_ms:
            r.ratio = r.anchor_ms / ms
            r.ratio_flashmla = r.flashmla_ms / ms
        else:
            r.ratio_graph = r.flashmla_graph_us / (r.graph_ms * 1e3)
    rep = bench.Report(device="H200", torch="x", commit="abc", mlagen="0", command="c",
                       rows=rows, host={"decode_us": 15.0, "metadata_and_decode_us": 25.0})
    bench.summarize(rep)
    assert rep.counted == 2
    assert rep.geomean == pytest.approx(math.sqrt(rows[0].ratio * rows[1].ratio))
    assert rep.won == sum(r.ratio >= 1 for r in rows[:2])
    md = bench.markdown(rep)
    assert "geomean over the 2 anchor rows" in md and "15.0 us" in md
    assert md.count("\n| 128 |") >= 2 and "CUDA-graph rows" in md


def test_busy_time_counts_overlaps_once():
    assert bench.busy_us([(0, 10), (2, 5), (8, 12), (20, 25)]) == 17
    assert bench.busy_us([]) == 0


def test_host_rounds_time_the_calls_not_the_syncs():
    """host_us_in_rounds: a fake clock where each call costs 5 us and each sync 1000 us (the
    GPU draining): the figure is the calls' 5 us, whatever the syncs cost; one slow round
    (a host hiccup) does not move the median."""
    now = [0.0]
    calls, syncs = [0], [0]

    def fn():
        calls[0] += 1
        now[0] += 5e-6 if calls[0] != 7 else 500e-6   # one slow call in the second round

    def sync():
        syncs[0] += 1
        now[0] += 1e-3

    us = bench.host_us_in_rounds(fn, sync, calls=100, per_round=10, clock=lambda: now[0])
    assert calls[0] == 100 and syncs[0] == 11          # a sync before each round and at the end
    assert us == pytest.approx(5.0)


def test_host_rounds_markdown_line():
    rows = bench.plan_rows()[:1]
    rows[0].check, rows[0].eager_ms, rows[0].ratio = "ok", 0.2, 1.0
    rep = bench.Report(device="H200", torch="x", commit="abc", mlagen="0", command="c",
                       rows=rows, host={"decode_us": 26.0, "metadata_and_decode_us": 39.0,
                                        "decode_rounds_us": 14.5,
                                        "metadata_and_decode_rounds_us": 27.5})
    bench.summarize(rep)
    md = bench.markdown(rep)
    assert "decode 14.5 us, metadata + decode 27.5 us" in md


def test_report_with_flashmla_timed_in_the_run():
    """--flashmla: the "now" columns and their geomean; FlashMLA's own failure is shown in
    place of its time and keeps the geomean out (it needs every anchor row)."""
    rows = bench.plan_rows()[:2] + [bench.plan_rows()[-1]]
    for r, ms in zip(rows, (0.2, 0.1, 0.05)):
        r.check, r.eager_ms, r.graph_ms = "ok", ms, ms * 0.9
        r.flashmla_now_check = "ok"
        if r.anchor_ms:
            r.ratio = r.anchor_ms / ms
            r.flashmla_now_ms = ms * 1.1
            r.ratio_now = r.flashmla_now_ms / ms
        else:
            r.flashmla_now_graph_us = r.graph_ms * 1e3 * 0.8
            r.ratio_now_graph = 0.8
    rep = bench.Report(device="H200", torch="x", commit="abc", mlagen="0", command="c",
                       rows=rows, flashmla_lib="/x/libflashmla.so")
    bench.summarize(rep)
    assert rep.geomean_now == pytest.approx(1.1) and rep.won_now == 2
    md = bench.markdown(rep)
    assert "**FlashMLA timed in this run** (`/x/libflashmla.so`" in md and "1.100" in md
    tables = [ln for ln in md.splitlines() if ln.startswith("|")]
    head, graph_head = tables[0], next(t for t in tables if "FlashMLA now us" in t)
    for ln in tables:          # every row has its header's cells
        n = ln.count("|")
        assert n in (head.count("|"), graph_head.count("|")), ln
    rows[1].flashmla_now_check, rows[1].ratio_now = "RuntimeError: FlashMLA decode: 700", None
    bench.summarize(rep)
    assert rep.geomean_now is None
    assert "RuntimeError: FlashMLA decode: 700 | - |" in bench.markdown(rep)
    plain = bench.Report(device="H200", torch="x", commit="abc", mlagen="0", command="c",
                         rows=rows)
    assert "now" not in bench.markdown(plain)


def test_flashmla_shim_signatures_match_the_python_copy():
    """flashmla_live.ARGTYPES is a Python copy of benchmarks/flashmla/shim.cu's C signatures."""
    import ctypes
    import re
    from pathlib import Path

    from mlagen.backends.hopper import flashmla_live

    src = (Path(__file__).resolve().parents[1] / "benchmarks" / "flashmla" / "shim.cu").read_text()
    cmap = {"int": ctypes.c_int, "long long": ctypes.c_longlong, "float": ctypes.c_float}
    for name, types in flashmla_live.ARGTYPES.items():
        m = re.search(r'extern "C" int ' + name + r"\(([^)]*)\)", src)
        assert m, name
        params = [p.strip() for p in m.group(1).split(",")]
        got = [ctypes.c_void_p if "*" in p else cmap[p.rsplit(" ", 1)[0]] for p in params]
        assert got == types, (name, params)
    assert flashmla_live.parts_for(132, 128) == 66 and flashmla_live.parts_for(132, 16) == 132
    assert flashmla_live.parts_for(132, 256) == 33 and flashmla_live.parts_for(132, 65) == 66


def test_flashmla_call_refuses_other_pages_before_the_gpu():
    """FlashMLA's kernel assumes 64-token pages: a page-16 row is refused, not launched."""
    from types import SimpleNamespace

    from mlagen.backends.hopper.flashmla_live import FlashMLACall

    q, k, bt, seqlens, _ = bench.workload(2, 1, 100, 16, False, device="cpu", page=16)
    with pytest.raises(ValueError, match="64-token pages"):
        FlashMLACall(None, SimpleNamespace(q=q, k=k, bt=bt, seqlens=seqlens))


def stand_in_cuda(monkeypatch, log, elapsed):
    """torch.cuda's graph capture, streams and events as stand-ins (no GPU): a capture and
    a replay write to `log`, the events' elapsed times come from the iterator `elapsed`."""
    from contextlib import contextmanager

    class Graph:
        def replay(self):
            log.append("replay")

    class Event:
        def __init__(self, enable_timing=False):
            pass

        def record(self):
            pass

        def synchronize(self):
            pass

        def elapsed_time(self, other):
            return next(elapsed)

    class Stream:
        def wait_stream(self, other):
            pass

    @contextmanager
    def capturing(g):
        log.append("capture")
        yield
        log.append("captured")

    @contextmanager
    def on(stream):
        yield

    for name, value in dict(Stream=Stream, current_stream=lambda: Stream(), stream=on,
                            CUDAGraph=Graph, graph=capturing, synchronize=lambda: None,
                            Event=Event).items():
        monkeypatch.setattr(torch.cuda, name, value)


def test_graph_time_is_the_median_replay_over_its_calls(monkeypatch):
    """time_graph on a stand-in torch.cuda (no GPU): three eager warm-up calls, GRAPH_CALLS
    calls captured into one graph on a side stream, three warm replays, then `replays`
    timed ones; each timed replay's ms over GRAPH_CALLS, their median."""
    log = []
    stand_in_cuda(monkeypatch, log, iter([4.0, 2.0, 6.0, 40.0, 8.0]))   # ms of 5 replays
    ms = bench.time_graph(lambda: log.append("call"), replays=5)
    n = bench.GRAPH_CALLS
    assert log == ["call"] * 3 + ["capture"] + ["call"] * n + ["captured"] + ["replay"] * 8
    assert ms == pytest.approx(6.0 / n)        # the median of 4, 2, 6, 40, 8 over n calls


def test_serving_step_is_its_graph_less_the_gemms_on_distinct_layers(monkeypatch):
    """time_step (stand-in torch.cuda, CPU tensors): one graph of the GEMMs alone, one of
    GEMM + decode per layer (and FlashMLA's, given its library); the decode's us per layer is
    the difference.  Each captured layer has its own q and K cache (copies of the Caller's,
    at other addresses, the same values) and its own weight, and its GEMM comes first."""
    from types import SimpleNamespace

    from mlagen.backends.hopper import flashmla_live

    n = bench.GRAPH_CALLS
    log, used = [], []
    # per graph: GRAPH_REPLAYS timed replays (ms per replay); GEMMs alone 2 ms, ours 5,
    # FlashMLA's 9
    r = bench.GRAPH_REPLAYS
    stand_in_cuda(monkeypatch, log, iter([2.0] * r + [5.0] * r + [9.0] * r))
    monkeypatch.setattr(bench, "STEP_WEIGHT", (64, 8))
    mm = torch.mm
    monkeypatch.setattr(torch, "mm", lambda x, w: (log.append(("mm", w.data_ptr())), mm(x, w)))
    q, k, bt, seqlens, _ = bench.workload(2, 1, 100, 16, False, device="cpu")

    def decode(q_, k_, *a, **kw):
        used.append((q_, k_))
        log.append("decode")

    class FM:
        def __init__(self, lib, c):
            self.c = c

        def __call__(self):
            used.append((self.c.q, self.c.k))
            log.append("fm")

    monkeypatch.setattr(flashmla_live, "FlashMLACall", FM)
    c = bench.Caller.__new__(bench.Caller)          # its decode(), without a GPU's metadata
    c.__dict__.update(q=q, k=k, bt=bt, seqlens=seqlens, md=None, ns=None, schedule=None,
                      api=SimpleNamespace(flash_mla_with_kvcache=decode))
    ours, theirs = bench.time_step(c, live=object())
    assert ours == pytest.approx((5.0 - 2.0) / n * 1e3)
    assert theirs == pytest.approx((9.0 - 2.0) / n * 1e3)
    # ours and FlashMLA's each saw 3 warm-up calls and n captured ones, cycling the layers
    assert len(used) == 2 * (3 + n)
    for run in (used[:3 + n], used[3 + n:]):
        captured = run[3:]
        assert {id(x) for x, _ in captured} == {id(x) for x, _ in captured[:n]}
        assert len({x.data_ptr() for x, _ in captured}) == n
        assert len({y.data_ptr() for _, y in captured}) == n
        assert all(torch.equal(x, q) and torch.equal(y, k) for x, y in captured)
    weights = [e[1] for e in log if isinstance(e, tuple)]
    assert len(set(weights)) == n                       # a weight per layer
    for kind in ("decode", "fm"):                       # each decode right after its GEMM
        at = [i for i, e in enumerate(log) if e == kind]
        assert at and all(isinstance(log[i - 1], tuple) for i in at)


def test_back_to_back_time_is_one_span_over_its_calls(monkeypatch):
    """time_back_to_back (stand-in torch.cuda): one warm-up call, then `calls` calls between
    two events, their elapsed ms over the calls in us."""
    log = []
    stand_in_cuda(monkeypatch, log, iter([10.0]))
    us = bench.time_back_to_back(lambda: log.append("call"), calls=50)
    assert log == ["call"] * 51 and us == pytest.approx(200.0)
    log.clear()
    stand_in_cuda(monkeypatch, log, iter([10.0]))
    bench.time_back_to_back(lambda: log.append("call"), calls=50, warmup=5)
    assert log == ["call"] * 55                          # five warm-ups, then the 50


def test_graph_timing_follows_the_graph_anchors_method():
    """The graph rows are compared with FlashMLA's figures, so they are timed as those were:
    GRAPH_CALLS calls a graph, replayed GRAPH_REPLAYS times (the anchor file says how)."""
    import json

    method = json.loads((bench.ANCHORS / "hopper-graph-anchor.json").read_text())["method"]
    assert f"graph of {bench.GRAPH_CALLS} back-to-back" in method
    assert f"replayed {bench.GRAPH_REPLAYS} times, median us per call" in method
    assert inspect.signature(bench.time_graph).parameters["replays"].default == bench.GRAPH_REPLAYS


def test_bench_of_given_shapes(monkeypatch, tmp_path):
    """`mlagen bench --shape`: the shapes given are the rows (none of the record's), each
    measured as a record's row is; the report is their own table, FlashMLA's "now" columns
    and its geomean over them under --flashmla."""
    from mlagen.backends.hopper.shapes import parse_shape

    shapes = [parse_shape("16,2,2048,64"), parse_shape("8,1,8192,16,varlen")]
    rows = bench.plan_rows(shapes=shapes)
    assert [(r.b, r.s_q, r.sk, r.h_q, r.varlen, r.kind) for r in rows] == \
        [(16, 2, 2048, 64, False, "shape"), (8, 1, 8192, 16, True, "shape")]
    measured = []

    def measure(r, schedule=None, live=None, vllm=None):
        measured.append(r.label())
        r.check, r.variant, r.eager_ms, r.graph_ms, r.kernel_ms = "ok", "v", 0.04, 0.03, 0.028
        r.flashmla_now_check, r.flashmla_now_ms, r.ratio_now = "ok", 0.05, 1.25
        r.flashmla_now_graph_us, r.ratio_now_graph = 36.0, 1.2
        if r.varlen:
            r.step_note = "step not timed: its 20 layers need 90.0 GiB, 100.0 GiB free"
        else:
            r.step_us, r.flashmla_now_step_us, r.ratio_now_step = 29.0, 34.8, 1.2
        return r

    class Cuda:
        @staticmethod
        def get_device_name():
            return "H200"

    monkeypatch.setattr(bench, "measure_row", measure)
    monkeypatch.setattr(bench, "host_time", lambda schedule: {"decode_us": 12.0,
                                                              "decode_rounds_us": 13.0})
    monkeypatch.setattr(torch, "cuda", Cuda)
    rep = bench.run_bench(shapes=shapes, progress=False, out_prefix=tmp_path / "r",
                          flashmla=None)
    assert measured == ["b=16 s_q=2 sk=2048 h_q=64", "b=8 s_q=1 sk=8192 h_q=16 varlen"]
    assert rep.counted == 0 and rep.geomean is None
    md = (tmp_path / "r.md").read_text()
    assert "the shapes given" in md and "anchor" not in md.split("\n| b |")[1]
    assert "| 16 | 2 | 2048 | 64 | no | ok | 0.0400 | 30.0 | 0.0280 | 29.0 |" in md
    assert "| 8 | 1 | 8192 | 16 | yes | ok | 0.0400 | 30.0 | 0.0280 | - |" in md
    assert "- b=8 s_q=1 sk=8192 h_q=16 varlen: step not timed: its 20 layers need" in md
    assert "In the table, step = us per layer" in md
    assert "| 8 | 1 | 8192 | 16 | yes | ok |" in md and "12.0 us" in md
    rep.flashmla_lib = "/x/libflashmla.so"
    bench.summarize(rep)
    assert rep.geomean_now == pytest.approx(1.25) and rep.won_now == 2
    md = bench.markdown(rep)
    assert "geomean of its time / ours 1.250; shapes won 2/2" in md
    assert "| 0.0500 | 1.250 | 36.0 | 1.20 | 34.8 | 1.20 |" in md


class _FakeCaller:
    """A Caller's tensors and lengths on the CPU: what measure_row and step_bytes read."""

    def __init__(self, b, s_q, sk, h_q, varlen, schedule=None, page=64):
        self.variant, self.lens = "v", [sk] * b
        self.q = torch.empty(b, s_q, h_q, 576, dtype=torch.bfloat16)
        self.k = torch.empty(b * sk // page, page, 1, 576, dtype=torch.bfloat16)


def _fake_timing(monkeypatch, free_bytes):
    steps = []
    monkeypatch.setattr(bench, "Caller", _FakeCaller)
    monkeypatch.setattr(bench, "check_output", lambda c: ("ok", 1.0, 0.0))
    monkeypatch.setattr(bench, "time_eager", lambda c: 0.05)
    monkeypatch.setattr(bench, "time_graph", lambda c: 0.04)
    monkeypatch.setattr(bench, "time_kernels", lambda c: 0.035)
    monkeypatch.setattr(bench, "time_step", lambda c, live=None: steps.append(c) or (41.0, None))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (free_bytes, 2 * free_bytes))
    return steps


@pytest.mark.parametrize("kind", ["graph", "shape"])
def test_the_serving_step_is_timed_on_graph_and_shape_rows(monkeypatch, kind):
    steps = _fake_timing(monkeypatch, 100 * 2**30)
    r = bench.measure_row(bench.Row(16, 2, 2048, 64, False, kind))
    assert r.error == "" and r.step_us == 41.0 and len(steps) == 1 and r.step_note == ""


def test_the_record_rows_are_not_stepped(monkeypatch):
    steps = _fake_timing(monkeypatch, 100 * 2**30)
    r = bench.measure_row(bench.Row(128, 1, 8192, 128, False, "anchor"))
    assert r.eager_ms == 0.05 and r.step_us is None and steps == []


def test_a_step_that_does_not_fit_in_free_memory_is_said_not_timed(monkeypatch):
    """20 layers of b = 128 at 32768 keys: ~4.5 GiB of K each, ~86 GiB for the step's 19
    copies; with 100 GiB free (70 % may be used) the row says why it has no step."""
    c = _FakeCaller(128, 1, 32768, 128, False)
    need = bench.step_bytes(c)
    assert need == 19 * (c.k.nbytes + c.q.nbytes) + 20 * 7168 * 4096 * 2
    steps = _fake_timing(monkeypatch, 100 * 2**30)
    r = bench.measure_row(bench.Row(128, 1, 32768, 128, False, "shape"))
    assert steps == [] and r.step_us is None and r.error == ""
    assert r.step_note == (f"step not timed: its 20 layers need {need / 2**30:.1f} GiB, "
                           "100.0 GiB free")
    steps = _fake_timing(monkeypatch, int(need / bench.STEP_MEM_SHARE) + 1)
    r = bench.measure_row(bench.Row(128, 1, 32768, 128, False, "shape"))
    assert len(steps) == 1 and r.step_note == "" and r.step_us == 41.0


def test_a_record_names_its_device_and_no_path_of_the_machine(monkeypatch, tmp_path):
    """Result files are named by device (and commit) and hold the FlashMLA library's file
    name, not the folder it lay in on the machine that ran."""
    from mlagen.backends.hopper import flashmla_live

    assert bench.device_tag("NVIDIA H200") == "h200"
    assert bench.device_tag("NVIDIA H100 80GB HBM3") == "h100_80gb_hbm3"

    class Cuda:
        @staticmethod
        def get_device_name():
            return "NVIDIA H200"

    monkeypatch.setattr(flashmla_live, "load", lambda path: object())
    monkeypatch.setattr(bench, "plan_rows", lambda quick, shapes, kv_formats=("",): [])
    monkeypatch.setattr(bench, "host_time", lambda schedule: {})
    monkeypatch.setattr(torch, "cuda", Cuda)
    rep = bench.run_bench(progress=False, out_prefix=tmp_path / "r",
                          flashmla="/some/machine/dir/libflashmla.so")
    assert rep.flashmla_lib == "libflashmla.so"
    assert "/some/machine" not in (tmp_path / "r.json").read_text()


def test_report_with_vllm_fp8_timed_in_the_run():
    """--vllm-fp8: a table of its fp8_e4m3 rows with its check and speed against ours; the
    geomean needs every such row timed."""
    shape = bench.plan_rows()[0]
    rows = [bench.Row(shape.b, shape.s_q, shape.sk, shape.h_q, shape.varlen, "shape", kv=kv)
            for kv in ("", "fp8_e4m3")]
    for r in rows:
        r.check, r.eager_ms, r.graph_ms = "ok", 0.1, 0.09
    rows[1].vllm_check, rows[1].vllm_cos_out, rows[1].vllm_ms = "ok", 2e-4, 0.12
    rows[1].ratio_vllm = 1.2
    rep = bench.Report(device="H200", torch="x", commit="abc", mlagen="0", command="c",
                       rows=rows, vllm_fp8_lib="dense_fp8.so")
    bench.summarize(rep)
    assert rep.geomean_vllm == pytest.approx(1.2)
    md = bench.markdown(rep)
    assert "vLLM's dense FP8 kernel timed in this run** (`dense_fp8.so`" in md
    line = next(ln for ln in md.splitlines() if ln.startswith("| b=") and "fp8_e4m3" in ln)
    assert "| ok | 2.0e-04 | 0.1200 | 1.200 |" in line
    rows[1].vllm_check, rows[1].ratio_vllm = "RuntimeError: x", None
    bench.summarize(rep)
    assert rep.geomean_vllm is None


def test_fp8_mma_rows_take_the_default_schedule_with_e4m3_mmas():
    """--fp8-mma mma: an fp8_e4m3 row on the register path is timed with the API's default
    for its shape, fp8_mma = "mma"; bf16 rows and a given schedule are left alone."""
    row = bench.Row(128, 1, 8192, 16, False, "shape", kv="fp8_e4m3")
    s = bench.row_schedule(row, None, "mma")
    assert s.mapping.fp8_mma == "mma" and s.mapping.fp8_converters == 0
    assert "fp8mma" in s.variant_name()
    assert bench.row_schedule(bench.Row(128, 1, 8192, 16, False, "shape"), None, "mma") is None
    assert bench.row_schedule(row, None, "") is None


def test_a_record_has_a_date_where_git_cannot_tell(monkeypatch, tmp_path):
    """A tree copied without .git (a GPU visit, MLAGEN_COMMIT set) still dates its record:
    the date orders the records (benchmarks/report.py), and an empty one sorts first."""
    from datetime import datetime

    monkeypatch.setattr(bench, "DATA_ROOT", tmp_path)   # no repository there
    d = datetime.fromisoformat(bench._commit_date("0123abc"))
    assert d.tzinfo is not None and d.year >= 2026


def test_record_rows_in_each_format_count_bf16_against_the_anchors():
    """--kv-format without --shape: each of the record's rows once a format, the 8-bit row
    after the bf16 one of its shape; the anchor geomean counts the bf16 rows alone (the
    anchors are bf16 figures), and each format's speed against bf16 is a geomean of its
    own, kind by kind."""
    rows = bench.plan_rows(kv_formats=("", "fp8_e4m3"))
    assert len(rows) == 2 * 59
    assert [r.kv for r in rows[:4]] == ["", "fp8_e4m3", "", "fp8_e4m3"]
    assert rows[0].label() + " fp8_e4m3" == rows[1].label() and rows[1].anchor_ms
    assert len(bench.plan_rows(quick=True, kv_formats=("", "fp8_ds_mla"))) == 18
    two = [r for r in rows if r.kind == "anchor"][:4] + [r for r in rows if r.kind == "graph"][:2]
    for r, ms in zip(two, (0.2, 0.1, 0.3, 0.12, 0.05, 0.04)):
        r.check, r.eager_ms, r.graph_ms, r.kernel_ms = "ok", ms, ms, ms
        r.ratio = r.anchor_ms / ms if r.anchor_ms else None
    rep = bench.Report(device="H200", torch="x", commit="abc", mlagen="0", command="c",
                       rows=two)
    bench.summarize(rep)
    assert rep.counted == 2
    assert rep.geomean == pytest.approx(math.sqrt(two[0].ratio * two[2].ratio))
    got = rep.kv_geomeans["fp8_e4m3"]
    assert got["anchor rows (2)"]["eager"] == pytest.approx(math.sqrt(2.0 * 2.5), rel=1e-3)
    assert got["graph rows (1)"]["graph"] == pytest.approx(1.25, rel=1e-3)
    # vLLM's geomean: the anchor rows (the graph rows repeat some of their shapes)
    for r, x in zip((two[1], two[3], two[5]), (0.5, 0.8, 2.0)):
        r.ratio_vllm = x
    bench.summarize(rep)
    assert rep.geomean_vllm == pytest.approx(math.sqrt(0.5 * 0.8))
    two[3].graph_ms = None      # a mode not timed on every row has no geomean
    bench.summarize(rep)
    assert "graph" not in rep.kv_geomeans["fp8_e4m3"]["anchor rows (2)"]
    md = bench.markdown(rep)
    assert "**fp8_e4m3, geomean of bf16 time / its time**" in md
    assert "| no | fp8_e4m3 | ok |" in md and "- anchor b=" in md and "- graph b=" in md
