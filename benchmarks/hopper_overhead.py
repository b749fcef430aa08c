"""Where the time of a small decode step goes: the whole call timed as the sweep does
(do_bench median), the host's time per call (a loop of calls, one sync at the end), and the
GPU's time per call (the same call captured in a CUDA graph and replayed).

    python benchmarks/hopper_overhead.py
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from mlagen.backends.hopper import api  # noqa: E402

from hopper_sweep import workload  # noqa: E402

ROWS = [(8, 1, 8192, 16, True), (1, 1, 32768, 128, False), (32, 1, 1024, 128, False)]


def main():
    import triton.testing

    for b, s_q, sk, h_q, varlen in ROWS:
        q, k, bt, seqlens, _ = workload(b, s_q, sk, h_q, varlen)

        def call():
            md, ns = api.get_mla_metadata(seqlens, s_q * h_q, 1)
            return api.flash_mla_with_kvcache(q, k, bt, seqlens, 512, md, ns, causal=True)

        call()
        torch.cuda.synchronize()
        bench = triton.testing.do_bench(call, warmup=25, rep=100, return_mode="median")
        n = 300
        t0 = time.perf_counter()
        for _ in range(n):
            call()
        host = (time.perf_counter() - t0) / n * 1e3
        torch.cuda.synchronize()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            call()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                call()
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        graph = triton.testing.do_bench(g.replay, warmup=25, rep=100, return_mode="median")
        print(f"b={b} s_q={s_q} sk={sk} h_q={h_q} varlen={int(varlen)}: do_bench {bench:.4f} ms, "
              f"host {host:.4f} ms/call, graph replay {graph:.4f} ms", flush=True)


if __name__ == "__main__":
    main()
