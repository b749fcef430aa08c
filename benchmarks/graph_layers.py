"""How the L2's state around a decode call moves its time: rows timed five ways (and
FlashMLA's call on the same tensors with --flashmla LIB), for the tree on PYTHONPATH.

    python benchmarks/graph_layers.py OUT.json [--rows b,s_q,s_k,h_q[,v] ...] [--modes ...]

  same      the anchor's graph method: 20 calls on one q and K cache, replayed
  layers    20 calls on 20 distinct q and K caches (bench.Step's layers, no GEMMs)
  gemm      bench.Step: each layer a GEMM on its own 56 MiB weight, then its decode
  gemmonly  the GEMMs of `gemm` alone (gemm - gemmonly: bench.time_step, the bench's
            "step" column)
  flush     eager, do_bench's median (the anchor's eager method: a 256 MB write before each
            call leaves the L2 full of dirty lines)
  b2b       eager, 50 calls back to back, no flush

Written for K's L2 policy (benchmarks/patches/k_evict_first.patch; docs/hopper.md step 33).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mlagen.backends.hopper import bench  # noqa: E402


def timed(c, call, step, modes, pre, r):
    """Modes of one side (ours: pre "", FlashMLA's: "fm_") into the row dict r; `call` is
    the side's single call, step.calls takes its per-layer decode."""
    us = lambda fn: bench.time_graph(fn) * 1e3   # noqa: E731
    decode = step.ours if not pre else step.flashmla(call.lib)
    if "same" in modes:
        r[pre + "same"] = us(call)
    if "layers" in modes:
        r[pre + "layers"] = us(step.calls(decode, gemm=False))
    if "gemm" in modes:
        r[pre + "gemm"] = us(step.calls(decode))
    if "flush" in modes:
        r[pre + "flush"] = bench.time_eager(call) * 1e3
    if "b2b" in modes:
        r[pre + "b2b"] = bench.time_back_to_back(call)


def main() -> int:
    import torch

    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--rows", nargs="*", default=None)
    ap.add_argument("--modes", default="same,layers,gemm,gemmonly,flush,b2b")
    ap.add_argument("--flashmla", default=None, help="FlashMLA's library: it is timed too")
    a = ap.parse_args()
    modes = a.modes.split(",")
    fm_lib = None
    if a.flashmla:
        from mlagen.backends.hopper.flashmla_live import FlashMLACall, load
        fm_lib = load(a.flashmla)
    rows = [tuple(int(x) for x in s.split(",")[:4]) + (s.endswith(",v"),) for s in a.rows] \
        if a.rows else [(g["b"], g["s_q"], g["sk"], g["h_q"], g["varlen"])
                        for g in bench.graph_rows()]
    res = []
    for b, s_q, sk, h_q, varlen in rows:
        c = bench.Caller(b, s_q, sk, h_q, varlen)
        r = dict(b=b, s_q=s_q, sk=sk, h_q=h_q, varlen=varlen, check=bench.check_output(c)[0],
                 k_mib=round(c.k.numel() * c.k.element_size() / 2**20, 1))
        step = bench.Step(c)
        if "gemmonly" in modes:
            r["gemmonly"] = bench.time_graph(step.calls()) * 1e3
        timed(c, c, step, modes, "", r)
        if fm_lib is not None:
            timed(c, FlashMLACall(fm_lib, c), step, modes, "fm_", r)
        del step
        torch.cuda.empty_cache()
        res.append(r)
        print(" ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}"
                       for k, v in r.items()), flush=True)
    json.dump(res, open(a.out, "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
