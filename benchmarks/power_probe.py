"""Clock and power in steady state: each workload runs back to back for ~2 s while
`nvidia-smi` samples SM clock and power every 50 ms; per workload the median clock, power
and throttle reasons of the second half, and the TFLOP/s of the whole run.  A bf16 GEMM
beside the decode rows says what this GPU's power cap allows for dense tensor-core work.

    python benchmarks/power_probe.py > power.log
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mlagen.backends.hopper import bench  # noqa: E402


def steady(fn, flops: float, seconds: float = 2.0) -> str:
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,"
                            "clocks_throttle_reasons.active", "--format=csv,noheader,nounits",
                            "-lms", "50"], stdout=subprocess.PIPE, text=True)
    time.sleep(0.3)
    fn()
    torch.cuda.synchronize()
    n, t0 = 0, time.time()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    while time.time() - t0 < seconds:
        for _ in range(10):
            fn()
        n += 10
        torch.cuda.synchronize()
    e1.record()
    torch.cuda.synchronize()
    ms = e0.elapsed_time(e1) / n
    time.sleep(0.2)
    smi.terminate()
    rows = [r.split(", ") for r in smi.communicate()[0].strip().splitlines()]
    half = rows[len(rows) // 2:-4] or rows
    clk = statistics.median(float(r[0]) for r in half)
    pw = statistics.median(float(r[1]) for r in half)
    reasons = sorted({r[2] for r in half})
    return (f"{ms:.4f} ms  {flops / ms / 1e9:6.1f} TFLOP/s  SM {clk:.0f} MHz  {pw:.0f} W  "
            f"throttle {'/'.join(reasons)}  TFLOP/s per GHz {flops / ms / 1e9 / clk * 1e3:.1f}")


def main():
    for b, s_q, sk, h_q in ((128, 1, 16384, 128), (128, 1, 8192, 128), (128, 2, 8192, 128),
                            (128, 1, 8192, 16)):
        c = bench.Caller(b, s_q, sk, h_q, False)
        fl, _ = bench.flops_bytes(b, s_q, h_q, c.lens)
        print(f"decode {b} {s_q} {sk} {h_q}: {steady(c, fl)}", flush=True)
        del c
        time.sleep(2)
    for n in (4096, 8192):
        a = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
        b_ = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
        print(f"gemm {n}^3: {steady(lambda: a @ b_, 2 * n ** 3)}", flush=True)
        time.sleep(2)


if __name__ == "__main__":
    main()
