"""Token-sparse decode on the H200: mlagen's sparse rows kernel against FlashMLA's sparse FP8
decode (flash_mla.flash_mla_with_kvcache with indices, imported only if installed) on the
same tensors, and bf16 caches against the device's read ceiling.  Writes a record
(results/hopper_sparse_<device>_<commit>.json, or --out) and prints a table.

    python benchmarks/hopper_sparse.py [--quick] [--out FILE]

Rows: DeepSeek-V3.2's (h_q 128, s_q 2, topk 2048, s_k 32768, b 2 / 64 / 74 / 128), the peak
(topk 16384, b 148), h_q 16 and 32 (FlashMLA with its heads padded to 64: it takes 64 or
128), and bf16 pages.  Each call is timed alone with device events after a 256 MiB write
that evicts L2 (the median of --reps); the caches are page-shuffled, the indices distinct
positions per query token in random order.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mlagen import kvformat                      # noqa: E402
from mlagen.backends.hopper import api          # noqa: E402
from mlagen.schedule.records import Schedule     # noqa: E402

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


def wide_schedule(kv: str) -> Schedule:
    """--wide-rows 64: beyond 32 heads, the 64-row kernel's sparse mode by a schedule."""
    return Schedule.build(target="hopper", dtype="bf16", kv_format="" if kv == "bf16" else kv,
                          attention="sparse", topk=2048, causal=False, rows_per_tile=64,
                          block_kv=64, buffers=2, warps=8, mainloop="wgmma")


def bench_row(row, fm, reps, flush, ceiling, wide=0):
    h_q, s_q, topk, s_k, b, kv = row
    g = torch.Generator(device="cuda").manual_seed(0)
    q, cache, idx = make(h_q, s_q, topk, s_k, b, kv, g)
    fp8 = kv == "fp8_ds_mla"
    sched, _ = api.get_mla_metadata()
    schedule = wide_schedule(kv) if wide == 64 and h_q > 32 else None
    ours = lambda: api.flash_mla_with_kvcache(q, cache, None, None, 512, sched,   # noqa: E731
                                              is_fp8_kvcache=fp8, indices=idx,
                                              schedule=schedule)
    o, lse = ours()
    rec = dict(h_q=h_q, s_q=s_q, topk=topk, s_k=s_k, b=b, kv=kv, page=PAGE,
               rows_per_tile=64 if schedule is not None else None,
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


def _git(*args) -> str:
    try:
        return subprocess.check_output(["git", "-C", str(ROOT), *args], text=True).strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="three rows")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--commit", default="", help="the tree's commit (a copy without .git)")
    ap.add_argument("--out", default="")
    ap.add_argument("--wide-rows", type=int, default=0, choices=(0, 64),
                    help="64: rows beyond 32 heads on the 64-row kernel (a schedule) "
                         "instead of the API's default tiles")
    a = ap.parse_args(argv)
    fm = None
    if importlib.util.find_spec("flash_mla") is not None:
        import flash_mla as fm
    t0 = time.perf_counter()
    flush = torch.empty(256 * 2 ** 20, dtype=torch.uint8, device="cuda")
    ceiling = read_ceiling(flush)
    rows = []
    for row in QUICK if a.quick else ROWS:
        try:
            rows.append(bench_row(row, fm, a.reps, flush, ceiling, a.wide_rows))
        except Exception as e:        # a row that fails is recorded, the rest still run
            rows.append(dict(zip(("h_q", "s_q", "topk", "s_k", "b", "kv"), row),
                             error=f"{type(e).__name__}: {e}"))
        print(json.dumps(rows[-1]), flush=True)
    commit = a.commit or _git("rev-parse", "--short=7", "HEAD")
    ratios = [r["ratio"] for r in rows if r.get("ratio")]
    rec = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, commit=commit,
               commit_date=_git("show", "-s", "--format=%cs", "HEAD") or time.strftime("%Y-%m-%d"),
               command="python benchmarks/hopper_sparse.py" + (" --quick" if a.quick else "")
               + (f" --wide-rows {a.wide_rows}" if a.wide_rows else ""),
               flashmla=getattr(fm, "__version__", "installed") if fm else "",
               read_ceiling_gbps=ceiling, rows=rows,
               geomean_ratio=(statistics.geometric_mean(ratios) if ratios else None),
               elapsed_s=time.perf_counter() - t0)
    tag = "_".join(w.lower() for w in rec["device"].split() if w.upper() != "NVIDIA")
    out = Path(a.out or ROOT / "benchmarks" / "results" / f"hopper_sparse_{tag}_{commit}.json")
    out.write_text(json.dumps(rec, indent=1) + "\n")
    print(f"\nread ceiling {ceiling:.0f} GB/s; record {out}")
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
