"""One workload's decode call, repeated: a target for ncu / nsys (GPU only).

    python benchmarks/hopper_one_call.py b s_q s_k h_q [--split-kv N] [--mainloop M] [--calls 5]
        [--varlen] [--api-defaults]

--varlen: the anchor's varlen lengths (mean s_k); --api-defaults: the API's per-shape default
(the tuned table, by batch) instead of default_schedule(s_q * h_q).
"""

from __future__ import annotations

import argparse

import torch

from mlagen.backends.hopper import defaults
from mlagen.backends.hopper.bench import Caller


def main() -> None:
    ap = argparse.ArgumentParser()
    for n in ("b", "s_q", "sk", "h_q"):
        ap.add_argument(n, type=int)
    ap.add_argument("--split-kv", default="auto")
    ap.add_argument("--mainloop", default="")
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--varlen", action="store_true")
    ap.add_argument("--api-defaults", action="store_true")
    a = ap.parse_args()
    s = defaults.default_schedule(a.s_q * a.h_q)
    if a.mainloop == "mma_sync":
        s = defaults.canonical(s.replace(mainloop="mma_sync", rows_per_tile=64, block_kv=32,
                                         buffers=3, warps=8))
    if a.split_kv != "auto":
        s = s.replace(split_kv=int(a.split_kv))
    c = Caller(a.b, a.s_q, a.sk, a.h_q, a.varlen, None if a.api_defaults else s)
    for _ in range(a.calls):
        c()
    torch.cuda.synchronize()
    print("ok", c.variant, int(c.md.shape[0]), "parts")


if __name__ == "__main__":
    main()
