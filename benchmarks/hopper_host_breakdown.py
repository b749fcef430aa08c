"""Where the host time of one eager decode call goes (b=1, s_k=1024, h_q=16): the whole call
in loops of 30 and 300 (a queue that fills shows as a larger per-call time at 300), the
same call on the Python path (the C++ one, fastcall.cpp, skipped), and each step of both
paths timed alone.

    python benchmarks/hopper_host_breakdown.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mlagen.backends.hopper import api, bench, ops  # noqa: E402


def per_call(fn, n, sync_every=False):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
        if sync_every:
            torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    return dt


def main():
    c = bench.Caller(1, 1, 1024, 16, False)
    c()
    a = (c.q, c.k, c.bt, c.seqlens, 512, c.md, c.ns, None, True, None)
    plan = api._DECODE_PLANS[api._signature(*a)]
    stream = ops._raw_stream(0)
    ws = plan.workspace(stream)
    out = c.q.new_empty(plan.out_shape)
    lse = c.q.new_empty(plan.lse_shape, dtype=torch.float32)
    lib = plan.lib.lib
    ptrs = (c.q.data_ptr(), c.k.data_ptr(), c.bt.data_ptr(), c.seqlens.data_ptr(),
            c.md.data_ptr(), c.ns.data_ptr(), out.data_ptr(), lse.data_ptr(), ws.data_ptr())
    last = api._LAST

    def python_path():
        last[0] = None          # the next call looks its plan up and launches from Python
        c()

    def metadata_python_path():
        api._LAST_METADATA[0] = None
        return api.get_mla_metadata(c.seqlens, 16, 1)

    fast = plan.fast
    args6 = (c.q, c.k, c.bt, c.seqlens, c.md, c.ns)
    steps = {
        "call x300": lambda: c(),
        "call x300, Python path": python_path,
        "C++ path: plan.run_fast": lambda: plan.run_fast(*args6),
        "C++ path: the extension's run alone": lambda: fast.run(*args6, stream, ws),
        "signature": lambda: api._signature(*a),
        "signature+lookup": lambda: api._DECODE_PLANS.get(api._signature(*a)),
        "2 x q.new_empty": lambda: (c.q.new_empty(plan.out_shape),
                                    c.q.new_empty(plan.lse_shape, dtype=torch.float32)),
        "workspace()": lambda: plan.workspace(stream),
        "raw stream": lambda: ops._raw_stream(0),
        "capturing?": lambda: ops._capturing(),
        "current_device": lambda: torch.cuda.current_device(),
        "ctypes launch (split+combine)": lambda: lib.mlagen_hopper_decode(
            plan.shape, *ptrs, plan.error, plan.scale_log2, stream),
        "plan.run": lambda: plan.run(c.q, c.k, c.bt, c.seqlens, c.md, c.ns),
        "metadata": lambda: api.get_mla_metadata(c.seqlens, 16, 1),
        "metadata, Python path": metadata_python_path,
    }
    print(f"C++ call path: {'on' if fast is not None else 'OFF'}")
    print(f"call x30: {per_call(c, 30):.2f} us")
    for name, fn in steps.items():
        n = 2000
        if "x300" in name or "launch" in name or "run" in name or "metadata" in name:
            n = 300
        print(f"{name}: {per_call(fn, n):.2f} us", flush=True)
    print(f"call with a sync after each: {per_call(c, 100, True):.2f} us")
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        c()
        with torch.cuda.graph(g):
            for _ in range(20):
                c()
    torch.cuda.synchronize()
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    g.replay()
    t0.record()
    for _ in range(10):
        g.replay()
    t1.record()
    t1.synchronize()
    print(f"GPU time per call (graph): {t0.elapsed_time(t1) / 200 * 1e3:.2f} us")


if __name__ == "__main__":
    main()
