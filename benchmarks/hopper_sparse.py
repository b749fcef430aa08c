"""Token-sparse decode on Hopper: mlagen's sparse rows kernel against FlashMLA's sparse FP8
decode (flash_mla.flash_mla_with_kvcache with indices, imported only if installed) on the
same tensors, and bf16 caches against the device's read ceiling.  Writes a record
(results/hopper_sparse_<device>_<commit>.json, or --out) and prints a table.

    python benchmarks/hopper_sparse.py [--quick] [--model1] [--batch 2,64] [--out FILE]

Rows: DeepSeek-V3.2's (h_q 128, s_q 2, topk 2048, s_k 32768, b 2 / 64 / 74 / 128), the peak
(topk 16384, b 148), h_q 16 and 32 (FlashMLA with its heads padded to 64: it takes 64 or
128), and bf16 pages.  Each call is timed alone with device events after a 256 MiB write
that evicts L2 (the median of --reps); the caches are page-shuffled, the indices distinct
positions per query token in random order.

--model1: DeepSeek-V4's rows instead (d_qk 512: FlashMLA's MODEL1, built by
benchmarks/anchors/flashmla_sparse.py), the four "MODEL1 CONFIG" performance cases of
FlashMLA 9241ae3's tests/test_flash_mla_sparse_decoding.py at b 2 / 64 / 74 / 128 / 148 / 256
and CONFIG1 at h_q 16 and 32 (b 64, 128; FlashMLA's heads padded to 64), their tensors made
as its tests/lib.py makes them: both pools fp8_ue8m0_paged (kvformat, FlashMLA's MODEL1
bytes), varlen lengths, random pages, distinct random positions (-1 past a length), a sink
with +-inf heads, extra_topk_length in CONFIG3 / 4, softmax scale 512**-0.55; its FLOP and
byte counts.  Each row's outputs are compared (and at b 2 with mlagen.reference) first.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mlagen import kvformat, reference           # noqa: E402
from mlagen.backends.hopper import api          # noqa: E402

PAGE = 64
# (h_q, s_q, topk, s_k, b, kv)
ROWS = [(128, 2, 2048, 32768, b, "fp8_ds_mla") for b in (2, 64, 74, 128)] + [
    (128, 2, 16384, 32768, 148, "fp8_ds_mla"),
    (16, 2, 2048, 32768, 64, "fp8_ds_mla"), (16, 2, 2048, 32768, 128, "fp8_ds_mla"),
    (32, 2, 2048, 32768, 64, "fp8_ds_mla"), (32, 2, 2048, 32768, 128, "fp8_ds_mla"),
    (128, 2, 2048, 32768, 64, "bf16"), (128, 2, 2048, 32768, 128, "bf16"),
    (16, 2, 2048, 32768, 128, "bf16"),
]
QUICK = [ROWS[1], ROWS[5], ROWS[9]]
# FlashMLA's MODEL1 CONFIGs: config -> (h_q, extra_topk, extra page, extra_topk_length); all
# s_q 2, a main pool of s_k 16384 in pages of 256 with topk 128, an extra pool of s_k 16384
MODEL1 = {1: (64, 512, 64, False), 2: (128, 1024, 64, False), 3: (64, 1024, 2, True),
          4: (128, 1024, 2, True)}
# (config, h_q, b)
M1_ROWS = [(c, MODEL1[c][0], b) for c in MODEL1 for b in (2, 64, 74, 128, 148, 256)] + [
    (1, h, b) for h in (16, 32) for b in (64, 128)]
M1_QUICK = [(1, 64, 2), (4, 128, 128), (1, 16, 64)]
M1_SQ, M1_SK, M1_TOPK, M1_PAGE, M1_SCALE = 2, 16384, 128, 256, 512 ** -0.55


def _flush(buf):
    buf.zero_()


def timed(fn, reps, flush):
    """Median device time (us) of fn, each call after an L2-evicting write."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        _flush(flush)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    return statistics.median(ts)


def graphed(fn):
    """fn captured in a CUDA graph (after a call outside it has filled the scheduling
    objects): a callable that replays it, the device time of the kernels alone."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay


def read_ceiling(flush) -> float:
    """A large device copy's bytes read + written per second (GB/s)."""
    x = torch.empty(2 ** 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    us = timed(lambda: y.copy_(x), 10, flush)
    return 2 * x.numel() / us / 1e3


def make(h_q, s_q, topk, s_k, b, kv, g):
    """q, the cache (page-shuffled, fp8_ds_mla bytes as float8_e4m3fn or bf16) and indices."""
    pages = b * (s_k // PAGE)
    perm = torch.randperm(pages, device="cuda", generator=g).to(torch.int32).view(b, -1)
    cache = torch.empty(pages, PAGE, 1, 656 if kv == "fp8_ds_mla" else 576,
                        dtype=torch.float8_e4m3fn if kv == "fp8_ds_mla" else torch.bfloat16,
                        device="cuda")
    step = 4096
    for i in range(0, pages, step):
        x = (torch.randn(min(step, pages - i), PAGE, 1, 576, device="cuda", generator=g) / 4)
        cache[i:i + step] = kvformat.quantize(x, kv) if kv == "fp8_ds_mla" else x.bfloat16()
    pos = torch.rand(b * s_q, s_k, device="cuda", generator=g).argsort(dim=1)[:, :topk]
    pos = pos.view(b, s_q, topk)
    rows = torch.arange(b, device="cuda")[:, None, None]
    idx = (perm[rows, pos // PAGE].long() * PAGE + pos % PAGE).to(torch.int32)
    q = (torch.randn(b, s_q, h_q, 576, device="cuda", generator=g) / 4).bfloat16()
    return q, cache, idx


def bench_row(row, fm, reps, flush, ceiling):
    h_q, s_q, topk, s_k, b, kv = row
    g = torch.Generator(device="cuda").manual_seed(0)
    q, cache, idx = make(h_q, s_q, topk, s_k, b, kv, g)
    fp8 = kv == "fp8_ds_mla"
    sched, _ = api.get_mla_metadata()
    ours = lambda: api.flash_mla_with_kvcache(q, cache, None, None, 512, sched,   # noqa: E731
                                              is_fp8_kvcache=fp8, indices=idx)
    o, lse = ours()
    rec = dict(h_q=h_q, s_q=s_q, topk=topk, s_k=s_k, b=b, kv=kv, page=PAGE,
               ours_us=timed(ours, reps, flush))
    token = 656 if fp8 else 1152
    gathered = b * s_q * topk * token
    rec["ours_gbps"] = gathered / rec["ours_us"] / 1e3
    if not fp8:
        rec["ceiling_gbps"] = ceiling
        rec["of_ceiling"] = rec["ours_gbps"] / ceiling
    if fm is not None and fp8:
        hp = max(64, h_q)
        qp = q if hp == h_q else torch.cat(
            [q, torch.zeros(b, s_q, hp - h_q, 576, dtype=q.dtype, device="cuda")], 2)
        fsched, _ = fm.get_mla_metadata()
        theirs = lambda: fm.flash_mla_with_kvcache(qp, cache, None, None, 512, fsched, None,  # noqa: E731
                                                   576 ** -0.5, False, True, idx)
        fo, fl = theirs()
        rec["flashmla_heads"] = hp
        rec["flashmla_us"] = timed(theirs, reps, flush)
        rec["ratio"] = rec["flashmla_us"] / rec["ours_us"]      # > 1: ours faster
        a, c = o.double(), fo[:, :, :h_q].double()
        rec["cos_diff_vs_flashmla"] = float(1 - 2 * (a * c).sum() / (a * a + c * c).sum())
        rec["max_abs_vs_flashmla"] = float((a - c).abs().max())
        rec["lse_max_vs_flashmla"] = float((lse - fl[:, :h_q]).abs().max())
    del q, cache, idx
    torch.cuda.empty_cache()
    return rec


def m1_pool(b, page, topk, lengths, g, rnd):
    """One pool as FlashMLA's lib.generate_testcase_for_decode makes it: (cache, indices,
    topk_length or None, keys attended, distinct slots read: its FLOP and byte counts)."""
    lens = [max(int(rnd.normalvariate(M1_SK, M1_SK / 2)), M1_SQ) for _ in range(b)]
    pad = -(-max(lens) // (4 * page)) * 4 * page
    pages = b * pad // page
    table = torch.randperm(pages, device="cuda", generator=g).view(b, -1)
    width, stride = 584, -(-page * 584 // 576) * 576
    raw = torch.zeros(pages, stride, dtype=torch.uint8, device="cuda")
    step = max(1, 2 ** 19 // page)
    for i in range(0, pages, step):
        n = min(step, pages - i)
        x = (torch.randn(n, page, 1, 512, device="cuda", generator=g) / 10).clamp_(-1, 1)
        c = kvformat.quantize(x.bfloat16(), "fp8_ue8m0_paged", rank=448)
        assert c.stride(0) == stride
        raw[i:i + n, :page * width] = c.view(torch.uint8).as_strided((n, page * width),
                                                                      (stride, 1))
    cache = raw[:, :page * width].view(pages, page, 1, width).view(torch.float8_e4m3fn)
    ln = torch.tensor(lens, device="cuda").repeat_interleave(M1_SQ)[:, None]
    r = torch.rand(b * M1_SQ, max(max(lens), topk), device="cuda", generator=g)
    r[torch.arange(r.shape[1], device="cuda")[None] >= ln] = -float("inf")
    pos = r.topk(topk, dim=1).indices
    ok = pos < ln
    pos = torch.where(ok, pos, 0)
    rows = torch.arange(b, device="cuda").repeat_interleave(M1_SQ)[:, None]
    idx = torch.where(ok, table[rows, pos // page] * page + pos % page, -1)
    idx = idx.to(torch.int32).view(b, M1_SQ, topk)
    tl = torch.randint(0, topk + 1, (b,), device="cuda", generator=g, dtype=torch.int32) \
        if lengths else None
    if tl is None:
        return cache, idx, None, b * M1_SQ * topk, idx.unique().numel()
    cut = idx.masked_fill(torch.arange(topk, device="cuda") >= tl[:, None, None], -1)
    return cache, idx, tl, int(tl.sum()) * M1_SQ, cut.unique().numel()


def agree(o, lse, o2, lse2) -> dict:
    """How far out / lse [b, h, s_q] are from another kernel's (or the reference's)."""
    a, c = o.double(), o2.double()
    fin = torch.isfinite(lse) & torch.isfinite(lse2)
    return dict(cos_diff=float(1 - 2 * (a * c).sum() / (a * a + c * c).sum()),
                max_abs=float((a - c).abs().max()),
                lse_max=float((lse - lse2)[fin].abs().max()) if fin.any() else 0.0,
                lse_inf_mismatch=int((torch.isfinite(lse) != torch.isfinite(lse2)).sum()))


def bench_model1(row, fm, reps, flush):
    """One MODEL1 row: check (both against each other, at b 2 against the reference), time."""
    cfg, h_q, b = row
    _, xtopk, xpage, xlen = MODEL1[cfg]
    g, rnd = torch.Generator(device="cuda").manual_seed(0), random.Random(0)
    main = m1_pool(b, M1_PAGE, M1_TOPK, False, g, rnd)
    extra = m1_pool(b, xpage, xtopk, xlen, g, rnd)
    q = torch.randn(b, M1_SQ, h_q, 512, device="cuda", generator=g).clamp_(-1, 1).bfloat16()
    sink, m = torch.randn(2, h_q, device="cuda", generator=g)
    sink[m > 0.5], sink[m < -0.5] = float("inf"), -float("inf")
    kw = dict(softmax_scale=M1_SCALE, is_fp8_kvcache=True, indices=main[1], topk_length=None,
              extra_k_cache=extra[0], extra_indices_in_kvcache=extra[1],
              extra_topk_length=extra[2])
    sched, _ = api.get_mla_metadata()
    ours = lambda: api.flash_mla_with_kvcache(q, main[0], None, None, 512, sched,  # noqa: E731
                                              attn_sink=sink, **kw)
    rec = dict(config=cfg, h_q=h_q, s_q=M1_SQ, topk=M1_TOPK, extra_topk=xtopk, s_k=M1_SK,
               b=b, kv="fp8_ue8m0_paged", page=M1_PAGE, extra_page=xpage,
               extra_topk_length=xlen, softmax_scale=M1_SCALE,
               flop=2 * h_q * (main[3] + extra[3]) * 1024,
               bytes=4 * b * M1_SQ * h_q * 512 + (main[4] + extra[4]) * 576)
    o, lse = ours()
    ok = True
    if b == 2:
        pools = [reference.SparsePool(main[0], main[1], None, "fp8_ue8m0_paged"),
                 reference.SparsePool(extra[0], extra[1], extra[2], "fp8_ue8m0_paged")]
        ro, rl = reference.sparse_attention(q, pools, softmax_scale=M1_SCALE, attn_sink=sink,
                                            dtype=torch.float64)
        rec["ours_vs_ref"] = agree(o, lse, ro, rl)
        ok &= rec["ours_vs_ref"]["cos_diff"] < 1e-5
    if fm is not None:
        hp = max(64, h_q)
        qp = torch.cat([q, q.new_zeros(b, M1_SQ, hp - h_q, 512)], 2)
        sp = torch.cat([sink, sink.new_zeros(hp - h_q)])
        fsched, _ = fm.get_mla_metadata()
        theirs = lambda: fm.flash_mla_with_kvcache(qp, main[0], None, None, 512,  # noqa: E731
                                                   fsched, None, attn_sink=sp, **kw)
        fo, fl = theirs()
        rec["flashmla_heads"] = hp
        rec["ours_vs_flashmla"] = agree(o, lse, fo[:, :, :h_q], fl[:, :h_q])
        if b == 2:
            rec["flashmla_vs_ref"] = agree(fo[:, :, :h_q], fl[:, :h_q], ro, rl)
        v = rec["ours_vs_flashmla"]
        ok &= v["cos_diff"] < 1e-5 and v["lse_max"] < 1e-3 and not v["lse_inf_mismatch"]
    rec["agree"] = bool(ok)
    rec["ours_us"] = timed(ours, reps, flush)
    rec["ours_tflops"] = rec["flop"] / rec["ours_us"] / 1e6
    rec["ours_gbps"] = rec["bytes"] / rec["ours_us"] / 1e3
    # in CUDA graphs (as a serving engine replays decode): the kernels alone, no host time
    rec["ours_graph_us"] = timed(graphed(ours), reps, flush)
    if fm is not None:
        rec["flashmla_us"] = timed(theirs, reps, flush)
        rec["ratio"] = rec["flashmla_us"] / rec["ours_us"]      # > 1: ours faster
        rec["flashmla_graph_us"] = timed(graphed(theirs), reps, flush)
        rec["graph_ratio"] = rec["flashmla_graph_us"] / rec["ours_graph_us"]
    del main, extra, q, o, lse
    torch.cuda.empty_cache()
    return rec


def _git(*args) -> str:
    try:
        return subprocess.check_output(["git", "-C", str(ROOT), *args], text=True).strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="three rows")
    ap.add_argument("--model1", action="store_true",
                    help="DeepSeek-V4's rows (d_qk 512, FlashMLA's MODEL1 CONFIG1-4)")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--commit", default="", help="the tree's commit (a copy without .git)")
    ap.add_argument("--out", default="")
    ap.add_argument("--batch", default="",
                    help="comma-separated batch sizes: only the rows of these")
    a = ap.parse_args(argv)
    try:
        only = {int(x) for x in a.batch.split(",") if x.strip()}
    except ValueError:
        ap.error(f"--batch {a.batch!r}: comma-separated whole numbers (e.g. 2,64)")
    table = (M1_QUICK if a.quick else M1_ROWS) if a.model1 else QUICK if a.quick else ROWS
    table = [r for r in table if not only or r[2 if a.model1 else 4] in only]
    if not table:
        ap.error(f"--batch {a.batch}: no row of this table has that batch size")
    fm = None
    if importlib.util.find_spec("flash_mla") is not None:
        import flash_mla as fm
    t0 = time.perf_counter()
    flush = torch.empty(256 * 2 ** 20, dtype=torch.uint8, device="cuda")
    ceiling = read_ceiling(flush)
    rows = []
    for row in table:
        try:
            rows.append(bench_model1(row, fm, a.reps, flush) if a.model1 else
                        bench_row(row, fm, a.reps, flush, ceiling))
        except Exception as e:        # a row that fails is recorded, the rest still run
            rows.append(dict(zip(("config", "h_q", "b") if a.model1 else
                                 ("h_q", "s_q", "topk", "s_k", "b", "kv"), row),
                             error=f"{type(e).__name__}: {e}"))
        print(json.dumps(rows[-1]), flush=True)
    commit = a.commit or _git("rev-parse", "--short=7", "HEAD")
    ratios = [r["ratio"] for r in rows if r.get("ratio")]
    graph_ratios = [r["graph_ratio"] for r in rows if r.get("graph_ratio")]
    rec = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, commit=commit,
               commit_date=_git("show", "-s", "--format=%cs", "HEAD") or time.strftime("%Y-%m-%d"),
               command="python benchmarks/hopper_sparse.py" + (" --quick" if a.quick else "")
               + (" --model1" if a.model1 else "")
               + (f" --batch {a.batch}" if a.batch else ""),
               flashmla=getattr(fm, "__version__", "installed") if fm else "",
               read_ceiling_gbps=ceiling, rows=rows,
               geomean_ratio=(statistics.geometric_mean(ratios) if ratios else None),
               geomean_graph_ratio=(statistics.geometric_mean(graph_ratios) if graph_ratios
                                    else None),
               elapsed_s=time.perf_counter() - t0)
    tag = "_".join(w.lower() for w in rec["device"].split() if w.upper() != "NVIDIA")
    out = Path(a.out or ROOT / "benchmarks" / "results" / f"hopper_sparse_{tag}_{commit}.json")
    out.write_text(json.dumps(rec, indent=1) + "\n")
    print(f"\nread ceiling {ceiling:.0f} GB/s; record {out}")
    if a.model1:
        print(f"{'cfg':>3} {'h_q':>4} {'b':>4} {'topk':>9} {'ours us':>9} {'FlashMLA':>9} "
              f"{'ratio':>6} {'graph us':>9} {'FlashMLA':>9} {'ratio':>6} {'TFLOPS':>6} "
              f"{'GB/s':>6} {'cos':>8} ok")
        for r in rows:
            if "error" in r:
                print(f"{r['config']:>3} {r['h_q']:>4} {r['b']:>4} error {r['error'][:60]}")
                continue
            fmu = f"{r['flashmla_us']:9.1f}" if "flashmla_us" in r else f"{'-':>9}"
            ra = f"{r['ratio']:6.3f}" if "ratio" in r else f"{'-':>6}"
            gf = f"{r['flashmla_graph_us']:9.1f}" if "flashmla_graph_us" in r else f"{'-':>9}"
            gr = f"{r['graph_ratio']:6.3f}" if "graph_ratio" in r else f"{'-':>6}"
            v = r.get("ours_vs_flashmla") or r.get("ours_vs_ref")
            cs = f"{v['cos_diff']:8.1e}" if v else f"{'-':>8}"
            tk = f"{r['topk']}+{r['extra_topk']}"
            print(f"{r['config']:>3} {r['h_q']:>4} {r['b']:>4} {tk:>9} "
                  f"{r['ours_us']:9.1f} {fmu} {ra} {r['ours_graph_us']:9.1f} {gf} {gr} "
                  f"{r['ours_tflops']:6.1f} {r['ours_gbps']:6.0f} "
                  f"{cs} {'yes' if r['agree'] else 'NO'}")
        return 0
    print(f"{'h_q':>4} {'s_q':>3} {'topk':>6} {'b':>4} {'kv':>10} {'ours us':>9} {'FlashMLA':>9}"
          f" {'ratio':>6} {'GB/s':>6} {'cos':>8}")
    for r in rows:
        if "error" in r:
            print(f"{r['h_q']:>4} {r['s_q']:>3} {r['topk']:>6} {r['b']:>4} {r['kv']:>10} "
                  f"error {r['error'][:60]}")
            continue
        fmu = f"{r['flashmla_us']:9.1f}" if "flashmla_us" in r else f"{'-':>9}"
        ra = f"{r['ratio']:6.3f}" if "ratio" in r else f"{'-':>6}"
        cs = f"{r['cos_diff_vs_flashmla']:8.1e}" if "cos_diff_vs_flashmla" in r else f"{'-':>8}"
        print(f"{r['h_q']:>4} {r['s_q']:>3} {r['topk']:>6} {r['b']:>4} {r['kv']:>10} "
              f"{r['ours_us']:9.1f} {fmu} {ra} {r['ours_gbps']:6.0f} {cs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
