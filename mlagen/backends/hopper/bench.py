"""`mlagen bench --target hopper`: the benchmark of record, on a GPU.

Every row is the anchor's exact workload (benchmarks/anchors/README.md, "How they were
timed"): seed 0, varlen lengths ``max(int(random.Random(0).normalvariate(mean, mean / 2)),
s_q)`` in batch order, the block table padded to a multiple of 256 tokens and filled with
``torch.randperm`` pages, q and the cache ``randn`` bf16, causal, page 64; the metadata is
computed once outside the timed call.  Each output is checked against the reference before
it is timed.  Three timings side by side:

    eager    triton.testing.do_bench(call, warmup=25, rep=200, return_mode="median")
    graph    one CUDA graph of 20 back-to-back calls, replayed; median per call
    kernels  the time the GPU runs kernels in one call (torch profiler: the union of kernel
             intervals, mean over 10 calls)

and the host time of one eager call (b=1, s_k=1024, h_q=16: 300 back-to-back calls, then one
sync).  The calls go through the public API with its per-shape defaults (or --schedule), so
whatever main loop the defaults pick is what is measured.  Rows: the 51 of
hopper-best-anchor.json (ratio = the better anchor's time / ours) and the 8 of
hopper-graph-anchor.json (ratio = FlashMLA's graph time / ours).  With --flashmla LIB
(flashmla_live.py) FlashMLA itself is timed on each row's tensors right after ours, the
same ways: the "now" columns, free of the anchor files' drift against the day's device.
"""

from __future__ import annotations

import json
import math
import random
import statistics
import subprocess
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

from ...console import human_bytes
from ...errors import MlagenError
from ...paths import DATA_ROOT

D, DV, PAGE = 576, 512, 64
ANCHORS = DATA_ROOT / "benchmarks" / "anchors"
RESULTS = DATA_ROOT / "benchmarks" / "results"
GRAPH_CALLS = 20
GRAPH_REPLAYS = 20   # the graph anchor's method: 20 calls a graph, replayed 20 times, median
HOST_SHAPE = (1, 1, 1024, 16)      # b, s_q, s_k, h_q of the host-time measurement
HOST_CALLS = 300
HOST_ROUND = 10      # calls per round of the queue-free host figure (a sync between rounds)


def _anchor(name: str):
    path = ANCHORS / name
    if not path.exists():
        raise MlagenError(f"{path} is missing: the benchmark of record runs from a source "
                          "checkout (its anchors are not in the wheel)")
    return json.loads(path.read_text())


def anchor_rows() -> list[dict]:
    return _anchor("hopper-best-anchor.json")


def graph_rows() -> list[dict]:
    return _anchor("hopper-graph-anchor.json")["rows"]


def seqlens_for(b: int, s_q: int, mean: int, varlen: bool, seed: int = 0) -> list[int]:
    """The anchor's lengths: Python's generator, drawn in batch order, floored at s_q."""
    if not varlen:
        return [mean] * b
    g = random.Random(seed)
    return [max(int(g.normalvariate(mean, mean / 2)), s_q) for _ in range(b)]


def workload(b: int, s_q: int, mean: int, h_q: int, varlen: bool, seed: int = 0,
             device: str = "cuda", page: int = PAGE):
    """(q, k_cache, block_table, cache_seqlens, lengths) exactly as the anchor made them
    (page: another page size, the same recipe; the anchor's is 64)."""
    import torch

    lens = seqlens_for(b, s_q, mean, varlen, seed)
    torch.manual_seed(seed)
    max_pad = math.ceil(max(lens) / 256) * 256
    num_blocks = b * max_pad // page
    block_table = torch.randperm(num_blocks, dtype=torch.int32).view(b, max_pad // page)
    q = torch.randn(b, s_q, h_q, D, dtype=torch.bfloat16, device=device)
    k_cache = torch.randn(num_blocks, page, 1, D, dtype=torch.bfloat16, device=device)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
    return q, k_cache, block_table.to(device), seqlens, lens


def quantized(k_cache, kv: str):
    """(cache in format kv, its descale_k or None): fp8_e4m3 with one descale, amax / 448
    of the whole cache (vLLM's per-tensor scale); fp8_ds_mla with its tile scales."""
    import torch

    from ... import kvformat

    descale = None
    if kvformat.get(kv).needs_descale:
        descale = (k_cache.float().abs().amax() / kvformat.E4M3_MAX).reshape(1)
    return kvformat.quantize(k_cache, kv, descale), descale


def flops_bytes(b: int, s_q: int, h_q: int, lens: list[int], kv: str = "") -> tuple[float, float]:
    """FLOPs and bytes moved (the cache's tokens at their format's size: kv)."""
    from ... import kvformat

    total = sum(lens)
    flops = s_q * total * h_q * (D + DV) * 2
    token = kvformat.get(kv).token_bytes() if kv else 2 * D
    nbytes = total * token + (b * s_q * h_q * D + b * s_q * h_q * DV) * 2
    return flops, nbytes


@dataclass
class Row:
    b: int
    s_q: int
    sk: int
    h_q: int
    varlen: bool
    kind: str                        # "anchor" (the 51), "graph" (the 8), or a tool's own
    page: int = PAGE                 # tokens per page (the anchor's rows: 64)
    kv: str = ""                     # the cache's 8-bit format (--kv-format), "": bf16
    anchor_ms: Optional[float] = None      # better of FlashMLA / FA3 (anchor rows)
    anchor_by: str = ""
    flashmla_ms: Optional[float] = None
    flashmla_graph_us: Optional[float] = None
    variant: str = ""
    check: str = ""                  # "ok" or why not
    cos_out: Optional[float] = None
    lse_err: Optional[float] = None
    eager_ms: Optional[float] = None
    graph_ms: Optional[float] = None
    kernel_ms: Optional[float] = None
    tflops: Optional[float] = None
    gbps: Optional[float] = None
    ratio: Optional[float] = None            # anchor_ms / eager_ms
    ratio_flashmla: Optional[float] = None   # flashmla_ms / eager_ms
    ratio_graph: Optional[float] = None      # flashmla_graph_us / graph us
    # FlashMLA timed in this run on the same tensors (--flashmla)
    flashmla_now_check: str = ""
    flashmla_now_ms: Optional[float] = None
    flashmla_now_graph_us: Optional[float] = None
    ratio_now: Optional[float] = None        # flashmla_now_ms / eager_ms
    ratio_now_graph: Optional[float] = None  # flashmla_now_graph_us / graph us
    # the serving step (graph and shape rows): us per layer the decode adds (time_step)
    step_us: Optional[float] = None
    step_note: str = ""                      # why the step was not timed (step_skip)
    flashmla_now_step_us: Optional[float] = None
    ratio_now_step: Optional[float] = None   # flashmla_now_step_us / step_us
    # vLLM's dense FP8 kernel timed in this run on the same fp8_e4m3 cache (--vllm-fp8)
    vllm_check: str = ""
    vllm_cos_out: Optional[float] = None
    vllm_ms: Optional[float] = None
    vllm_graph_us: Optional[float] = None
    ratio_vllm: Optional[float] = None       # vllm_ms / eager_ms
    ratio_vllm_graph: Optional[float] = None  # vllm_graph_us / graph us
    error: str = ""

    def label(self) -> str:
        return (f"b={self.b} s_q={self.s_q} sk={self.sk} h_q={self.h_q}"
                f"{' varlen' if self.varlen else ''}"
                f"{f' page={self.page}' if self.page != PAGE else ''}"
                f"{f' {self.kv}' if self.kv else ''}")


@dataclass
class Report:
    device: str
    torch: str
    commit: str
    mlagen: str
    command: str
    rows: list = field(default_factory=list)
    host: dict = field(default_factory=dict)
    geomean: Optional[float] = None
    geomean_flashmla: Optional[float] = None
    won: int = 0
    counted: int = 0
    geomean_now: Optional[float] = None      # FlashMLA timed in this run / ours
    won_now: int = 0
    flashmla_lib: str = ""
    vllm_fp8_lib: str = ""
    geomean_vllm: Optional[float] = None     # vLLM's FP8 time / ours over the fp8_e4m3 rows
    kv_geomeans: dict = field(default_factory=dict)   # each 8-bit format's speed against bf16
    elapsed_s: float = 0.0
    commit_date: str = ""     # the commit's date (git), what orders the records of runs


def _commit() -> str:
    """$MLAGEN_COMMIT when set (a copy of the tree inside another checkout, as on the GPU
    visits, would otherwise report the outer checkout's commit), else git's HEAD."""
    import os

    if os.environ.get("MLAGEN_COMMIT"):
        return os.environ["MLAGEN_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=DATA_ROOT,
                              capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def device_tag(name: str) -> str:
    """A device's short name in result file names: "NVIDIA H200" -> "h200"."""
    words = name.split()
    if len(words) > 1 and words[0].upper() == "NVIDIA":
        words = words[1:]
    return "_".join(w.lower() for w in words)


def _commit_date(commit: str) -> str:
    """The commit's date (git), which orders the records of runs; where git cannot tell (a
    copy of the tree without .git, as on the GPU visits), the time of this run (UTC)."""
    try:
        date = subprocess.run(["git", "show", "-s", "--format=%cI", commit], cwd=DATA_ROOT,
                              capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        date = ""
    return date or datetime.now(timezone.utc).isoformat(timespec="seconds")


class Caller:
    """The timed call of one workload: flash_mla_with_kvcache with metadata made once."""

    def __init__(self, b, s_q, sk, h_q, varlen, schedule=None, data=None, page=PAGE, kv=""):
        from . import api

        self.api = api
        # data: another Caller's workload tuple, so that schedules compared on one shape
        # read the very same K pages and the workload is made once (tune's candidates)
        self.data = data or workload(b, s_q, sk, h_q, varlen, page=page)
        self.q, self.k, self.bt, self.seqlens, self.lens = self.data
        # kv: the same bf16 cache quantized to an 8-bit format (--kv-format)
        self.kv, self.descale = kv, None
        if kv:
            self.k, self.descale = quantized(self.k, kv)
        self.schedule = schedule
        self.md, self.ns = api.get_mla_metadata(self.seqlens, s_q * h_q, 1, schedule=schedule,
                                                kv_format=kv or None)
        self.variant = api._library_key(s_q * h_q, "bf16", schedule, b, self.q.device,
                                        page_size=page, kv=kv)

    def __call__(self):
        return self.decode(self.q, self.k)

    def decode(self, q, k_cache):
        """The call on another q and K cache of the same shapes (bench.Step's layers)."""
        descale = getattr(self, "descale", None)     # fp8_e4m3's (--kv-format)
        kw = {} if descale is None else {"descale_k": descale}
        return self.api.flash_mla_with_kvcache(q, k_cache, self.bt, self.seqlens, DV, self.md,
                                               self.ns, causal=True, schedule=self.schedule,
                                               **kw)


def check_output(c: Caller, cos_tol: float = 1e-5, lse_tol: float = 1e-3
                 ) -> tuple[str, float, float]:
    """Compare one call with the fp32 reference: NaN/inf masks equal, cos-diff of out under
    cos_tol (randn data: bf16 P rounding in the kernel), lse within lse_tol relative."""
    import torch

    from ...reference import attention
    from ...verify.compare import cos_diff

    out, lse = c()
    torch.cuda.synchronize()
    ref_o, ref_l = attention(c.q, c.k, c.bt, c.seqlens, DV, None, True, torch.float32,
                             kv_format=getattr(c, "kv", "") or None,
                             k_descale=getattr(c, "descale", None))
    if not torch.equal(torch.isfinite(out), torch.isfinite(ref_o.to(out.dtype))):
        return "out: finite masks differ", float("nan"), float("nan")
    if not torch.equal(torch.isfinite(lse), torch.isfinite(ref_l)):
        return "lse: finite masks differ", float("nan"), float("nan")
    fin = torch.isfinite(ref_l)
    cd = cos_diff(out.float()[torch.isfinite(out)], ref_o[torch.isfinite(out)])
    le = float(((lse[fin] - ref_l[fin]).abs() / ref_l[fin].abs().clamp(min=1.0)).max()) \
        if bool(fin.any()) else 0.0
    ok = cd < cos_tol and le < lse_tol
    return ("ok" if ok else f"mismatch (cos-diff {cd:.2e}, lse rel err {le:.2e})"), cd, le


def time_eager(c: Caller) -> float:
    import triton.testing

    return triton.testing.do_bench(c, warmup=25, rep=200, return_mode="median")


def capture_graph(fn, calls: int = GRAPH_CALLS):
    """A CUDA graph of `calls` back-to-back calls of fn (after 3 warm-up calls on a side
    stream), replayed 3 times to warm it."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(calls):
                fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    for _ in range(3):
        g.replay()
    return g


def time_graph(c: Caller, replays: int = GRAPH_REPLAYS) -> float:
    """ms per call: one graph of GRAPH_CALLS back-to-back calls, replayed; the median."""
    import torch

    g = capture_graph(c)
    times = []
    for _ in range(replays):
        t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0.record()
        g.replay()
        t1.record()
        t1.synchronize()
        times.append(t0.elapsed_time(t1) / GRAPH_CALLS)
    del g
    return statistics.median(times)


def time_back_to_back(fn, calls: int = 50, warmup: int = 1) -> float:
    """us per call of `calls` eager calls in a row (after `warmup` calls), no cache flush
    between them: do_bench's figure without its L2 flush."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0.record()
    for _ in range(calls):
        fn()
    t1.record()
    t1.synchronize()
    return t0.elapsed_time(t1) / calls * 1e3


# The serving step (graph rows): a decode step's layers each read their own q and K cache,
# and other kernels run between their attention calls.  GRAPH_CALLS layers in one graph,
# each a GEMM on its own bf16 weight of STEP_WEIGHT (DeepSeek-V3's hidden size by 4096
# columns, 56 MiB: the L2 keeps no layer's K for the next) and then the layer's decode; the
# decode's share of a layer is the graph's time less that of the GEMMs alone.  The anchor's
# graph method replays one q and K with nothing between: the L2 holds its K between replays.
STEP_WEIGHT = (7168, 4096)


class Step:
    """GRAPH_CALLS layers of one Caller's workload: copies of q and K, and a weight each."""

    def __init__(self, c: Caller):
        import torch

        self.c = c
        self.qs = [c.q] + [c.q.clone() for _ in range(GRAPH_CALLS - 1)]
        self.ks = [c.k] + [c.k.clone() for _ in range(GRAPH_CALLS - 1)]
        self.ws = [torch.randn(*STEP_WEIGHT, dtype=c.q.dtype, device=c.q.device)
                   for _ in range(GRAPH_CALLS)]
        self.x = torch.randn(max(c.q.shape[0] * c.q.shape[1], 16), STEP_WEIGHT[0],
                             dtype=c.q.dtype, device=c.q.device)

    def calls(self, decode=None, gemm: bool = True):
        """The call capture_graph records GRAPH_CALLS times: the next layer's GEMM, then
        decode(layer) (None: the GEMMs alone; gemm=False: the decodes alone)."""
        import torch

        n = [0]

        def call():
            layer = n[0] % GRAPH_CALLS
            n[0] += 1
            if gemm:
                torch.mm(self.x, self.ws[layer])
            if decode is not None:
                decode(layer)
        return call

    def flashmla(self, live):
        """FlashMLA's decode of a layer (its library `live`), as ours takes them."""
        from types import SimpleNamespace

        from .flashmla_live import FlashMLACall

        c = self.c
        fms = [FlashMLACall(live, SimpleNamespace(q=q, k=k, bt=c.bt, seqlens=c.seqlens))
               for q, k in zip(self.qs, self.ks)]
        return lambda layer: fms[layer]()

    def ours(self, layer: int):
        return self.c.decode(self.qs[layer], self.ks[layer])


# A step holds GRAPH_CALLS copies of q and K: a shape whose copies would take more than this
# share of the GPU's free memory is not stepped (a long-context batch of 128 is ~5 GB of K a
# layer); its row says so instead.
STEP_MEM_SHARE = 0.7


def step_bytes(c: Caller) -> int:
    """Device bytes a Step of this workload allocates beyond the Caller's own tensors."""
    weight = STEP_WEIGHT[0] * STEP_WEIGHT[1] * c.q.element_size()
    return (GRAPH_CALLS - 1) * (c.k.nbytes + c.q.nbytes) + GRAPH_CALLS * weight


def step_skip(c: Caller) -> str:
    """Why a Step of this workload is not timed ("" when it fits in free GPU memory)."""
    import torch

    need, free = step_bytes(c), torch.cuda.mem_get_info()[0]
    if need <= STEP_MEM_SHARE * free:
        return ""
    return (f"step not timed: its {GRAPH_CALLS} layers need {human_bytes(need)}, "
            f"{human_bytes(free)} free")


def time_step(c: Caller, live=None) -> tuple[float, Optional[float]]:
    """us per layer that the decode adds to a serving step (Step): ours, and FlashMLA's on
    the same layers when `live` (its library) is given."""
    step = Step(c)
    gemms = time_graph(step.calls())
    ours = time_graph(step.calls(step.ours)) - gemms
    theirs = None
    if live is not None:
        theirs = (time_graph(step.calls(step.flashmla(live))) - gemms) * 1e3
    return ours * 1e3, theirs


def time_kernels(c: Caller, calls: int = 10) -> float:
    """ms per call that the GPU is busy with kernels (torch profiler): the union of the
    kernels' intervals, so that the combine, launched early by programmatic dependent launch
    and waiting beside the split kernel, is not counted twice; gaps between calls are not
    counted."""
    spans = [(s, e) for name, s, e in kernel_events(c, calls)
             if "memcpy" not in name and "memset" not in name]
    return busy_us(spans) / calls / 1e3


def kernel_events(c: Caller, calls: int = 10) -> list[tuple[str, float, float]]:
    """(lower-cased name, start us, end us) of every GPU activity of `calls` calls (torch
    profiler), after one call outside the profile."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    c()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            c()
        torch.cuda.synchronize()
    return [(e.name.lower(), e.time_range.start, e.time_range.end) for e in prof.events()
            if str(getattr(e, "device_type", "")).endswith("CUDA")]


def busy_us(spans) -> float:
    """Length of the union of [start, end) intervals."""
    total, end = 0.0, -math.inf
    for s, e in sorted(spans):
        if s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def host_us_in_rounds(fn, sync, calls: int = HOST_CALLS, per_round: int = HOST_ROUND,
                      clock=time.perf_counter) -> float:
    """µs of host time per call with the launch queue kept short: rounds of `per_round`
    calls, each round timed from its first call to the return of its last, with a sync
    (not timed) between rounds; the median round.  Once the GPU time per call exceeds the
    host time, HOST_CALLS calls in a row fill the launch queue and time the GPU instead."""
    rounds = []
    for _ in range(max(1, calls // per_round)):
        sync()
        t0 = clock()
        for _ in range(per_round):
            fn()
        rounds.append((clock() - t0) / per_round)
    sync()
    rounds.sort()
    return rounds[len(rounds) // 2] * 1e6


def host_time(schedule=None) -> dict:
    """µs of host time per eager call: HOST_CALLS back-to-back calls, then one sync (the
    issue's method, FlashMLA's 35 us); and the same calls in rounds of HOST_ROUND with a
    sync between rounds (the host alone, whatever the GPU time per call)."""
    import torch

    from . import api

    b, s_q, sk, h_q = HOST_SHAPE
    c = Caller(b, s_q, sk, h_q, False, schedule)
    out = {}
    for name, fn in (("decode", c),
                     ("metadata_and_decode",
                      lambda: (api.get_mla_metadata(c.seqlens, s_q * h_q, 1, schedule=schedule),
                               c()))):
        for _ in range(30):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(HOST_CALLS):
            fn()
        host = (time.perf_counter() - t0) / HOST_CALLS * 1e6
        torch.cuda.synchronize()
        out[name + "_us"] = round(host, 2)
        out[name + "_rounds_us"] = round(host_us_in_rounds(fn, torch.cuda.synchronize), 2)
    out["shape"] = dict(b=b, s_q=s_q, sk=sk, h_q=h_q)
    out["strict"] = bool(api.ops.STRICT)
    return out


def _time_beside(row: Row, f, modes) -> tuple:
    """(eager ms, graph us, eager ratio, graph ratio) of another kernel's call f on a row's
    tensors, timed the modes ours was (ratio = its time / ours; None where not timed)."""
    ms = time_eager(f) if "eager" in modes else None
    us = time_graph(f) * 1e3 if "graph" in modes else None
    return (ms, us, ms / row.eager_ms if ms and row.eager_ms else None,
            us / (row.graph_ms * 1e3) if us and row.graph_ms else None)


def measure_now(row: Row, c: Caller, live, modes) -> None:
    """FlashMLA (the library `live`) on the Caller's tensors, timed the modes ours was."""
    from .flashmla_live import FlashMLACall

    try:
        f = FlashMLACall(live, c)
        row.flashmla_now_check = check_output(f)[0]
        if row.flashmla_now_check == "ok":
            (row.flashmla_now_ms, row.flashmla_now_graph_us, row.ratio_now,
             row.ratio_now_graph) = _time_beside(row, f, modes)
    except Exception as e:                 # FlashMLA's failure is not our row's
        row.flashmla_now_check = f"{type(e).__name__}: {e}"


def measure_vllm(row: Row, c: Caller, mod, modes) -> None:
    """vLLM's dense FP8 kernel (the extension `mod`) on the Caller's fp8_e4m3 cache, timed the
    modes ours was.  Its Q and P are e4m3, so it is held to a looser check than ours (cos-diff
    1e-3, lse 1e-2 relative); the cos-diff is recorded."""
    from .vllm_fp8_live import VllmFp8Call

    try:
        f = VllmFp8Call(mod, c)
        row.vllm_check, row.vllm_cos_out, _ = check_output(f, 1e-3, 1e-2)
        if row.vllm_check == "ok":
            row.vllm_ms, row.vllm_graph_us, row.ratio_vllm, row.ratio_vllm_graph = \
                _time_beside(row, f, modes)
    except Exception as e:                 # the anchor's failure is not our row's
        row.vllm_check = f"{type(e).__name__}: {e}"


def measure_row(row: Row, schedule=None, modes=("eager", "graph", "kernels", "step"),
                live=None, vllm=None) -> Row:
    """modes: eager, graph, kernels; step (graph and shape rows: time_step, where its
    layers fit in GPU memory)."""
    import torch

    try:
        c = Caller(row.b, row.s_q, row.sk, row.h_q, row.varlen, schedule, page=row.page,
                   **({"kv": row.kv} if row.kv else {}))
        row.variant = c.variant
        row.check, row.cos_out, row.lse_err = check_output(c)
        if row.check != "ok":
            return row                     # a wrong answer is not timed
        flops, nbytes = flops_bytes(row.b, row.s_q, row.h_q, c.lens, row.kv)
        if "eager" in modes:
            row.eager_ms = time_eager(c)
            row.tflops = flops / 1e9 / row.eager_ms
            row.gbps = nbytes / 1e6 / row.eager_ms
            if row.anchor_ms:
                row.ratio = row.anchor_ms / row.eager_ms
            if row.flashmla_ms:
                row.ratio_flashmla = row.flashmla_ms / row.eager_ms
        if "graph" in modes:
            row.graph_ms = time_graph(c)
            if row.flashmla_graph_us:
                row.ratio_graph = row.flashmla_graph_us / (row.graph_ms * 1e3)
        if "kernels" in modes:
            try:
                row.kernel_ms = time_kernels(c)
            except Exception as e:         # the profiler is optional to the record
                row.error = f"profiler: {type(e).__name__}: {e}"
        if live is not None:
            measure_now(row, c, live, [m for m in modes if m not in ("kernels", "step")])
        if vllm is not None and row.kv == "fp8_e4m3":
            measure_vllm(row, c, vllm, [m for m in modes if m not in ("kernels", "step")])
        if "step" in modes and row.kind in ("graph", "shape"):
            row.step_note = step_skip(c)
            if not row.step_note:
                row.step_us, row.flashmla_now_step_us = time_step(
                    c, live if row.flashmla_now_check == "ok" else None)
                if row.flashmla_now_step_us:
                    row.ratio_now_step = row.flashmla_now_step_us / row.step_us
    except Exception as e:
        row.error = f"{type(e).__name__}: {e}"
    finally:
        torch.cuda.synchronize()
    return row


def plan_rows(quick: bool = False, shapes=(), kv_formats=("",)) -> list[Row]:
    """The benchmark of record's rows (the 51 anchor rows, then the 8 graph rows), or the
    caller's shapes (shapes.Shape records: `mlagen bench --shape`), timed the same way, each
    shape once for each cache format of kv_formats ("": bf16; `--kv-format`); the record's
    rows likewise, each format's row after the bf16 one of its shape."""
    if shapes:
        return [Row(s.b, s.s_q, s.sk, s.h_q, s.varlen, "shape", kv=kv)
                for s in shapes for kv in kv_formats]
    rows = [Row(r["b"], r["s_q"], r["sk"], r["h_q"], bool(r["varlen"]), "anchor",
                anchor_ms=r["best_ms"], anchor_by=r["best"], flashmla_ms=r["flashmla_ms"],
                kv=kv)
            for r in anchor_rows() for kv in kv_formats]
    for g in graph_rows():
        rows += [Row(g["b"], g["s_q"], g["sk"], g["h_q"], bool(g["varlen"]), "graph",
                     flashmla_graph_us=g["flashmla_graph_us"], kv=kv) for kv in kv_formats]
    if quick:
        n = len(kv_formats)
        rows = rows[:6 * n] + [r for r in rows if r.kind == "graph"][:3 * n]
    return rows


def _geomean(xs) -> Optional[float]:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def summarize(rep: Report) -> None:
    # the anchors are bf16 figures: the record's geomeans count the bf16 rows (an 8-bit
    # row's speed is against bf16 on its shape: kv_geomeans)
    anchored = [r for r in rep.rows if r.kind == "anchor" and not r.kv]
    rep.counted = len(anchored)
    ratios = [r.ratio for r in anchored if r.ratio]
    rep.geomean = _all_geomean(ratios, anchored)
    rep.geomean_flashmla = _all_geomean([r.ratio_flashmla for r in anchored if r.ratio_flashmla],
                                        anchored)
    rep.won = sum(1 for x in ratios if x >= 1.0)
    # FlashMLA now / ours over the anchor rows, or over the caller's shapes (--shape)
    counted = anchored or [r for r in rep.rows if r.kind == "shape"]
    now = [r.ratio_now for r in counted if r.ratio_now]
    rep.geomean_now = _all_geomean(now, counted)
    rep.won_now = sum(1 for x in now if x >= 1.0)
    # vLLM's over the fp8_e4m3 anchor rows, or shapes (the graph rows repeat some of them)
    fp8 = [r for r in rep.rows if r.kv == "fp8_e4m3" and r.kind != "graph"]
    rep.geomean_vllm = _all_geomean([r.ratio_vllm for r in fp8 if r.ratio_vllm], fp8)
    rep.kv_geomeans = kv_geomeans(rep)


def _all_geomean(xs, rows) -> Optional[float]:
    """The geomean of xs where every one of rows gave one, else None."""
    return _geomean(xs) if xs and len(xs) == len(rows) else None


def _shape_key(r: Row) -> tuple:
    """A row's kind and shape: an 8-bit row's bf16 row has the same."""
    return (r.kind, r.b, r.s_q, r.sk, r.h_q, r.varlen, r.page)


def kv_geomeans(rep: Report) -> dict:
    """{format: {mode: geomean of bf16 time / its time}} over the rows of each kind (the
    anchor rows, the graph rows, or the shapes) where both were timed; a mode only where
    every 8-bit row of the kind has it."""
    base = {_shape_key(r): r for r in rep.rows if not r.kv}
    out: dict = {}
    for kv in sorted({r.kv for r in rep.rows if r.kv}):
        for kind in ("anchor", "graph", "shape"):
            pairs = [(base.get(_shape_key(r)), r)
                     for r in rep.rows if r.kv == kv and r.kind == kind]
            if not pairs:
                continue
            cell = {}
            for mode, attr in (("eager", "eager_ms"), ("graph", "graph_ms"),
                               ("kernels", "kernel_ms")):
                xs = [getattr(b, attr) / getattr(r, attr) for b, r in pairs
                      if b is not None and getattr(b, attr) and getattr(r, attr)]
                if len(xs) == len(pairs):
                    cell[mode] = round(_geomean(xs), 4)
            if cell:
                out.setdefault(kv, {})[f"{kind} rows ({len(pairs)})"] = cell
    return out


def _f(x, fmt):
    return "-" if x is None else format(x, fmt)


def _now_cells(r: Row, unit: str) -> str:
    """The two "now" cells of a row; FlashMLA's own failure (or wrong answer) in place of
    its time."""
    if r.flashmla_now_check not in ("", "ok"):
        return f" {r.flashmla_now_check[:60]} | - |"
    if unit == "ms":
        return f" {_f(r.flashmla_now_ms, '.4f')} | {_f(r.ratio_now, '.3f')} |"
    return f" {_f(r.flashmla_now_graph_us, '.1f')} | {_f(r.ratio_now_graph, '.2f')} |"


# what the step column is, said in both reports
_STEP = (f"step = us per layer that the decode adds to a serving step (a graph of {GRAPH_CALLS} "
         f"layers, each a GEMM on its own {STEP_WEIGHT[0]} x {STEP_WEIGHT[1]} weight, then the "
         "decode on its own q and K cache; less the GEMMs alone):")


# how every row is checked and timed, said in both reports
_TIMING = ("each output checked against the fp32 reference before timing. eager = do_bench "
           f"median (warmup 25, rep 200); graph = CUDA graph of {GRAPH_CALLS} calls replayed "
           f"{GRAPH_REPLAYS} times, median per call; kernels = sum of kernel times (torch "
           "profiler).")


def markdown(rep: Report) -> str:
    if any(r.kind == "shape" for r in rep.rows):
        return _shapes_markdown(rep)
    lines = [f"# Hopper benchmark of record: {rep.device}", "",
             f"commit `{rep.commit}`, mlagen {rep.mlagen}, torch {rep.torch}; "
             f"command `{rep.command}`; {rep.elapsed_s:.0f} s.", "",
             "Workloads exactly as benchmarks/anchors/README.md counts them (seed 0, "
             "random.Random varlen lengths, 256-token padded tables, randperm pages, causal); "
             + _TIMING + " ratio = anchor time / eager time (> 1: faster than the better of "
             "FlashMLA and FA3).", ""]
    if rep.geomean is not None:
        lines.append(f"**geomean over the {rep.counted} anchor rows: {rep.geomean:.3f}** of the "
                     f"best anchor ({_f(rep.geomean_flashmla, '.3f')} of FlashMLA); rows won "
                     f"{rep.won}/{rep.counted}.")
    if rep.host:
        lines.append(f"Host time per eager call (b=1, s_k=1024, h_q=16, {HOST_CALLS} calls, one "
                     f"sync): decode {rep.host.get('decode_us')} us, metadata + decode "
                     f"{rep.host.get('metadata_and_decode_us')} us (FlashMLA 35 us); in rounds "
                     f"of {HOST_ROUND} calls with a sync between rounds (the host alone): "
                     f"decode {rep.host.get('decode_rounds_us')} us, metadata + decode "
                     f"{rep.host.get('metadata_and_decode_rounds_us')} us.")
    now = bool(rep.flashmla_lib)
    if now:
        lines.append(f"**FlashMLA timed in this run** (`{rep.flashmla_lib}`, same tensors, right "
                     f"after ours): geomean of its time / ours {_f(rep.geomean_now, '.3f')}; "
                     f"rows won {rep.won_now}/{rep.counted}.")
    lines += kv_geomean_lines(rep)
    kvs = any(r.kv for r in rep.rows)   # --kv-format: a kv column; ratios against bf16 anchors
    extra = " FlashMLA now ms | vs FlashMLA now |" if now else ""
    lines += ["", "| b | s_q | sk | h_q | varlen |" + (" kv |" if kvs else "") + " check | "
              "eager ms | graph ms | kernels ms | "
              "TFLOPS | GB/s | anchor ms | ratio | vs FlashMLA |" + extra,
              "|" + "---|" * ((16 if now else 14) + kvs)]
    for r in rep.rows:
        if r.kind != "anchor":
            continue
        lines.append(f"| {r.b} | {r.s_q} | {r.sk} | {r.h_q} | {'yes' if r.varlen else 'no'} | "
                     + (f"{r.kv or 'bf16'} | " if kvs else "") +
                     f"{r.check or r.error} | {_f(r.eager_ms, '.4f')} | {_f(r.graph_ms, '.4f')} | "
                     f"{_f(r.kernel_ms, '.4f')} | {_f(r.tflops, '.1f')} | {_f(r.gbps, '.0f')} | "
                     f"{r.anchor_ms:.4f} ({r.anchor_by}) | {_f(r.ratio, '.3f')} | "
                     f"{_f(r.ratio_flashmla, '.3f')} |" + (_now_cells(r, "ms") if now else ""))
    extra = (" FlashMLA now us | ratio now | FlashMLA now step us | step ratio now |"
             if now else "")
    lines += ["", f"CUDA-graph rows ({GRAPH_CALLS} calls per graph, us per call) against "
              "FlashMLA's graph figure; " + _STEP, "",
              "| b | s_q | sk | h_q | varlen |" + (" kv |" if kvs else "") + " check | "
              "graph us | FlashMLA us | ratio | eager us | kernels us | step us |" + extra,
              "|" + "---|" * ((16 if now else 12) + kvs)]
    for r in rep.rows:
        if r.kind != "graph":
            continue
        lines.append(f"| {r.b} | {r.s_q} | {r.sk} | {r.h_q} | {'yes' if r.varlen else 'no'} | "
                     + (f"{r.kv or 'bf16'} | " if kvs else "") +
                     f"{r.check or r.error} | {_f(r.graph_ms and r.graph_ms * 1e3, '.1f')} | "
                     f"{r.flashmla_graph_us} | {_f(r.ratio_graph, '.2f')} | "
                     f"{_f(r.eager_ms and r.eager_ms * 1e3, '.1f')} | "
                     f"{_f(r.kernel_ms and r.kernel_ms * 1e3, '.1f')} | {_f(r.step_us, '.1f')} |"
                     + (_now_cells(r, "us") + f" {_f(r.flashmla_now_step_us, '.1f')} | "
                        f"{_f(r.ratio_now_step, '.2f')} |" if now else ""))
    lines += kv_speedups(rep) + vllm_lines(rep)
    variants = sorted({r.variant for r in rep.rows if r.variant})
    lines += ["", "Variants the defaults picked: " + ", ".join(f"`{v}`" for v in variants), ""]
    return "\n".join(lines)


def kv_geomean_lines(rep: Report) -> list[str]:
    """Markdown lines: kv_geomeans, one line a format."""
    out = []
    for kv, kinds in rep.kv_geomeans.items():
        cells = "; ".join(f"{k}: " + ", ".join(f"{m} {x:.3f}x" for m, x in c.items())
                          for k, c in kinds.items())
        out.append(f"**{kv}, geomean of bf16 time / its time** (same run, same tensors "
                   f"quantized): {cells}.")
    return [""] + out if out else []


def _shapes_markdown(rep: Report) -> str:
    """`mlagen bench --shape ...`: the caller's shapes, timed as the record's rows are, with
    FlashMLA beside them under --flashmla (no anchor figures exist for them)."""
    now = bool(rep.flashmla_lib)
    lines = [f"# Hopper benchmark: {rep.device}, the shapes given", "",
             f"commit `{rep.commit}`, mlagen {rep.mlagen}, torch {rep.torch}; "
             f"command `{rep.command}`; {rep.elapsed_s:.0f} s.", "",
             "Inputs as the benchmark of record makes them (seed 0, varlen lengths "
             "random.Random(0).normalvariate(s_k, s_k / 2) floored at s_q, 256-token padded "
             "tables, randperm pages, causal); " + _TIMING, ""]
    if now:
        lines.append(f"**FlashMLA timed in this run** (`{rep.flashmla_lib}`, same tensors, right "
                     f"after ours): geomean of its time / ours {_f(rep.geomean_now, '.3f')}; "
                     f"shapes won {rep.won_now}/{len(rep.rows)}.")
        lines.append("")
    lines.append("In the table, " + _STEP)
    extra = (" FlashMLA now ms | vs FlashMLA now | FlashMLA now graph us | graph vs FlashMLA now |"
             " FlashMLA now step us | step vs FlashMLA now |" if now else "")
    # a kv column when --kv-format gave 8-bit rows
    kvs = any(r.kv for r in rep.rows)
    lines += ["", "| b | s_q | sk | h_q | varlen |" + (" kv |" if kvs else "") + " check | "
              "eager ms | graph us | kernels ms | step us | TFLOPS | GB/s | variant |" + extra,
              "|" + "---|" * ((19 if now else 13) + kvs)]
    for r in rep.rows:
        lines.append(f"| {r.b} | {r.s_q} | {r.sk} | {r.h_q} | {'yes' if r.varlen else 'no'} | "
                     + (f"{r.kv or 'bf16'} | " if kvs else "") +
                     f"{r.check or r.error} | {_f(r.eager_ms, '.4f')} | "
                     f"{_f(r.graph_ms and r.graph_ms * 1e3, '.1f')} | {_f(r.kernel_ms, '.4f')} | "
                     f"{_f(r.step_us, '.1f')} | "
                     f"{_f(r.tflops, '.1f')} | {_f(r.gbps, '.0f')} | `{r.variant}` |"
                     + (_now_cells(r, "ms") + _now_cells(r, "us") +
                        f" {_f(r.flashmla_now_step_us, '.1f')} | {_f(r.ratio_now_step, '.2f')} |"
                        if now else ""))
    notes = [f"{r.label()}: {r.step_note}" for r in rep.rows if r.step_note]
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    lines += kv_geomean_lines(rep) + kv_speedups(rep) + vllm_lines(rep)
    if rep.host:
        lines += ["", f"Host time per eager decode call (b=1, s_k=1024, h_q=16): "
                  f"{rep.host.get('decode_us')} us ({rep.host.get('decode_rounds_us')} us in "
                  f"rounds of {HOST_ROUND})."]
    return "\n".join(lines + [""])


def _row_name(r: Row) -> str:
    """A row's label, with its kind where the record's anchor and graph rows share shapes."""
    return r.label() if r.kind == "shape" else f"{r.kind} {r.label()}"


def kv_speedups(rep: Report) -> list[str]:
    """Markdown lines: each 8-bit row's speed against the bf16 row of its shape (bf16 time /
    its time) in eager, kernels and step time; none without both."""
    base = {_shape_key(r): r for r in rep.rows if not r.kv}
    out = []
    for r in rep.rows:
        b = base.get(_shape_key(r))
        if not r.kv or b is None:
            continue
        cells = []
        for name, x, y in (("eager", b.eager_ms, r.eager_ms), ("kernels", b.kernel_ms,
                                                                r.kernel_ms),
                           ("graph", b.graph_ms, r.graph_ms), ("step", b.step_us, r.step_us)):
            cells.append(f"{name} {_f(x / y if x and y else None, '.2f')}x")
        out.append(f"- {_row_name(r)}: " + ", ".join(cells) + " of bf16")
    return ["", "Speed of each 8-bit cache against bf16 on its shape (bf16 time / its time):"
            ] + out if out else []


def vllm_lines(rep: Report) -> list[str]:
    """Markdown lines: vLLM's dense FP8 kernel beside each fp8_e4m3 row (--vllm-fp8)."""
    if not rep.vllm_fp8_lib:
        return []
    out = ["", f"**vLLM's dense FP8 kernel timed in this run** (`{rep.vllm_fp8_lib}`, the same "
           f"fp8_e4m3 cache, its q quantized with one scale): geomean of its time / ours "
           f"{_f(rep.geomean_vllm, '.3f')} (the anchor rows, or the shapes).", "",
           "| row | its check | its cos-diff | its eager ms | ours / its speed | its graph us | "
           "graph: ours / its speed |", "|---|---|---|---|---|---|---|"]
    for r in rep.rows:
        if r.kv != "fp8_e4m3":
            continue
        out.append(f"| {_row_name(r)} | {r.vllm_check[:60]} | {_f(r.vllm_cos_out, '.1e')} | "
                   f"{_f(r.vllm_ms, '.4f')} | {_f(r.ratio_vllm, '.3f')} | "
                   f"{_f(r.vllm_graph_us, '.1f')} | {_f(r.ratio_vllm_graph, '.2f')} |")
    return out


def rich_table(rep: Report):
    from rich.table import Table

    t = Table(title=f"mlagen hopper bench ({rep.device}, {rep.commit})")
    for col in ("row", "check", "eager ms", "graph ms", "kernels ms", "anchor ms", "ratio",
                "graph ratio"):
        t.add_column(col, justify="left" if col in ("row", "check") else "right")
    for r in rep.rows:
        ratio = r.ratio if r.kind == "anchor" else None
        style = None if ratio is None else ("green" if ratio >= 1 else
                                            ("yellow" if ratio >= 0.9 else "red"))
        t.add_row(f"{r.kind[0]} {r.label()}", r.check or r.error[:30], _f(r.eager_ms, ".4f"),
                  _f(r.graph_ms, ".4f"), _f(r.kernel_ms, ".4f"),
                  _f(r.anchor_ms, ".4f"), _f(ratio, ".3f"), _f(r.ratio_graph, ".2f"),
                  style=style)
    return t


def mma_refusal(shapes, kv_formats) -> str:
    """Why --fp8-mma mma cannot time these rows ("" if it can): e4m3 MMAs are built on the
    register path alone, which the API's default takes for fp8_e4m3 at s_q * h_q <= 16
    and batch >= FP8_REGS_BATCH (defaults.py)."""
    from .defaults import FP8_REGS_BATCH

    if "fp8_e4m3" not in kv_formats:
        return "--fp8-mma mma times the fp8_e4m3 rows: give --kv-format fp8_e4m3 too"
    if not shapes:
        return ("--fp8-mma mma: the record's rows are not all on the register path that "
                "e4m3 MMAs are built on: give --shape")
    for s in shapes:
        if s.s_q * s.h_q > 16 or s.b < FP8_REGS_BATCH:
            return (f"--fp8-mma mma: shape {s.label()} is not on the register path that "
                    f"e4m3 MMAs are built on (s_q * h_q <= 16 and b >= {FP8_REGS_BATCH})")
    return ""


def row_schedule(row: Row, schedule, fp8_mma: str = ""):
    """The schedule a row is timed with: the caller's; or, for an fp8_e4m3 row under
    --fp8-mma, the API's default for its shape with that fp8_mma."""
    if not fp8_mma or row.kv != "fp8_e4m3" or schedule is not None:
        return schedule
    from .defaults import canonical, default_schedule

    d = default_schedule(row.s_q * row.h_q, "bf16", row.b, kv="fp8_e4m3")
    return canonical(d.replace(fp8_mma=fp8_mma))


def run_bench(schedule=None, quick: bool = False, out_prefix: Optional[Path] = None,
              progress: bool = True, command: str = "mlagen bench --target hopper",
              flashmla: Optional[str] = None, shapes=(), kv_formats=("",),
              vllm_fp8: Optional[str] = None, fp8_mma: str = "") -> Report:
    import torch

    from ...version import __version__

    live = None
    if flashmla:
        from .flashmla_live import load as load_flashmla

        live = load_flashmla(flashmla)      # a bad path is refused before anything runs
    vllm = None
    if vllm_fp8:
        from .vllm_fp8_live import load as load_vllm

        vllm = load_vllm(vllm_fp8)
    t0 = time.perf_counter()
    # the library's file name only: a result file names no path of the machine it ran on
    rep = Report(device=torch.cuda.get_device_name(), torch=torch.__version__,
                 commit=_commit(), mlagen=__version__, command=command,
                 flashmla_lib=Path(flashmla).name if flashmla else "",
                 vllm_fp8_lib=Path(vllm_fp8).name if vllm_fp8 else "")
    rep.commit_date = _commit_date(rep.commit) if rep.commit else ""
    rows = plan_rows(quick, shapes, kv_formats)
    # host time first, in a fresh process: measured after all the rows (59 profiler runs,
    # a full caching allocator) the same loop took 48 us per call, in a fresh process 19
    # (5569878:benchmarks/results/hopper_host_breakdown_6768d1b.log); which of the two costs it is
    # not yet measured
    rep.host = host_time(schedule)
    if progress:
        from rich.progress import Progress

        with Progress(transient=True) as bar:
            task = bar.add_task("bench", total=len(rows))
            for r in rows:
                bar.update(task, description=r.label())
                rep.rows.append(measure_row(r, row_schedule(r, schedule, fp8_mma),
                                            live=live, vllm=vllm))
                bar.advance(task)
    else:
        for r in rows:
            rep.rows.append(measure_row(r, row_schedule(r, schedule, fp8_mma), live=live,
                                        vllm=vllm))
            print(f"{r.label()}: {r.check or r.error} eager {_f(r.eager_ms, '.4f')} graph "
                  f"{_f(r.graph_ms, '.4f')} kernels {_f(r.kernel_ms, '.4f')} ratio "
                  f"{_f(r.ratio, '.3f')} graph ratio {_f(r.ratio_graph, '.2f')} step "
                  f"{_f(r.step_us, '.1f')} us", flush=True)
    summarize(rep)
    rep.elapsed_s = time.perf_counter() - t0
    if out_prefix is not None:
        out_prefix.parent.mkdir(parents=True, exist_ok=True)
        data = asdict(rep)
        out_prefix.with_suffix(".json").write_text(json.dumps(data, indent=1))
        out_prefix.with_suffix(".md").write_text(markdown(rep))
    return rep


def bench_main(args) -> int:
    import torch

    from .. import backend       # the registry (hopper.backend imports this module)
    from .defaults import check_overrides

    check_overrides()            # a malformed MLAGEN_HOPPER_* table is refused first
    from .shapes import parse_shape

    shapes = [parse_shape(t) for t in (getattr(args, "shape", None) or [])]
    # --kv-format a,b,... (hopper: with --shape, each shape in each format, the same bf16
    # cache quantized)
    kv_formats = tuple(x.strip() for x in (getattr(args, "kv_format", None) or "").split(",")
                       if x.strip())
    from ... import kvformat
    from .api import _FP8_FORMATS

    for kv in kv_formats:
        if kv not in ("bf16",) + _FP8_FORMATS:
            raise MlagenError(f"--kv-format {kv!r}: the hopper kernels read bf16, "
                              f"{', '.join(_FP8_FORMATS)} (of {', '.join(kvformat.FORMATS)})")
    kv_formats = tuple("" if kv == "bf16" else kv for kv in kv_formats) or ("",)
    if shapes and args.quick:
        raise MlagenError("--quick cuts the benchmark of record's rows; with --shape the "
                          "shapes given are the rows: give one or the other")
    fp8_mma = getattr(args, "fp8_mma", None) or ""
    if fp8_mma == "mma":
        why = mma_refusal(shapes, kv_formats)
        if why:
            raise MlagenError(why)
    flashmla = getattr(args, "flashmla", None)
    if flashmla:
        from .flashmla_live import load as load_flashmla

        load_flashmla(flashmla)      # refused with one line before the device is touched
    vllm_fp8 = getattr(args, "vllm_fp8", None)
    if vllm_fp8:
        if "fp8_e4m3" not in kv_formats:
            raise MlagenError("--vllm-fp8 times vLLM's kernel on the fp8_e4m3 rows: give "
                              "--kv-format fp8_e4m3 too")
        from .vllm_fp8_live import load as load_vllm

        load_vllm(vllm_fp8)
    why = backend("hopper").device_check()
    if why:   # "target hopper needs ...": said as the bench command's own words
        raise MlagenError("bench --" + why.split(";")[0] + "; the other targets' "
                          "benchmarks run anywhere")
    schedule = None
    if args.schedule:
        from ...schedule import load

        schedule = load(args.schedule)
    # a record: <what>_<device>_<commit>.json (benchmarks/report.py reads hopper_bench_*:
    # the bf16 record's rows alone)
    what = "shapes" if shapes else ("formats" if kv_formats != ("",) else "bench")
    prefix = (Path(args.output) if args.output else
              RESULTS / f"hopper_{what}_"
                        f"{device_tag(torch.cuda.get_device_name())}_{_commit() or 'nocommit'}")
    if prefix.suffix in (".json", ".md"):
        prefix = prefix.with_suffix("")
    rep = run_bench(schedule, quick=args.quick, out_prefix=prefix,
                    progress=not getattr(args, "no_progress", False),
                    command="mlagen bench --target hopper" + (" --quick" if args.quick else "")
                    + "".join(f" --shape {s.label()}" for s in shapes)
                    + (" --kv-format " + ",".join(kv or "bf16" for kv in kv_formats)
                       if kv_formats != ("",) else "")
                    + (f" --flashmla {Path(flashmla).name}" if flashmla else "")
                    + (f" --vllm-fp8 {Path(vllm_fp8).name}" if vllm_fp8 else "")
                    + (f" --fp8-mma {fp8_mma}" if fp8_mma else ""),
                    flashmla=flashmla, vllm_fp8=vllm_fp8,
                    shapes=shapes, kv_formats=kv_formats, fp8_mma=fp8_mma)
    from rich.console import Console

    con = Console()
    con.print(rich_table(rep))
    if not shapes:
        con.print(f"geomean {_f(rep.geomean, '.3f')} of the best anchor "
                  f"({_f(rep.geomean_flashmla, '.3f')} of FlashMLA), rows won {rep.won}/"
                  f"{rep.counted}; host {rep.host.get('decode_us')} us per decode call")
    if flashmla:
        con.print(f"FlashMLA timed in this run: geomean of its time / ours "
                  f"{_f(rep.geomean_now, '.3f')}, rows won {rep.won_now}/"
                  f"{rep.counted or len(rep.rows)}")
    for line in kv_geomean_lines(rep)[1:]:
        con.print(line.replace("**", ""))
    if vllm_fp8:
        con.print(f"vLLM's dense FP8 kernel timed in this run: geomean of its time / ours "
                  f"{_f(rep.geomean_vllm, '.3f')} over the fp8_e4m3 anchor rows (or shapes)")
    con.print(f"written: {prefix.with_suffix('.json')}, {prefix.with_suffix('.md')}")
    bad = [r for r in rep.rows if r.check != "ok"]
    return 1 if bad else 0
