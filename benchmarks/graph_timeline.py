"""Where a CUDA graph of back-to-back decode calls gains over eager calls: the kernels of
one replay (torch profiler), ours and FlashMLA's (FM_LIB, built by benchmarks/flashmla/),
on the same tensors: each kernel's mean length, and the gap from one call's last kernel to
the next call's first (negative: the calls overlap).

    python benchmarks/graph_timeline.py --flashmla ../fmlib/libflashmla.so --row 128,1,8192,16

Written in session 17 for docs/hopper.md step 29's next step (1); first run on the H200 in
session 19 (`benchmarks/results/s19/v1.sh`; docs/hopper.md step 31).
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mlagen.backends.hopper import bench  # noqa: E402


def replay_events(fn, calls: int):
    import torch
    from torch.profiler import ProfilerActivity, profile

    g = bench.capture_graph(fn, calls)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        g.replay()
        torch.cuda.synchronize()
    ev = [(e.time_range.start, e.time_range.end, e.name) for e in prof.events()
          if str(getattr(e, "device_type", "")).endswith("CUDA")
          and "memcpy" not in e.name.lower() and "memset" not in e.name.lower()]
    return sorted(ev)


def summary(ev, calls: int) -> str:
    per = len(ev) // calls
    if per * calls != len(ev) or per == 0:
        return f"{len(ev)} kernels for {calls} calls: not per-call groups"
    lines = []
    for k in range(per):
        ks = ev[k::per]
        lines.append(f"  kernel {k} ({ks[0][2][:60]}): mean {statistics.mean(e - s for s, e, _ in ks):.1f} us")
    gaps = [ev[(i + 1) * per][0] - max(e for _, e, _ in ev[i * per:(i + 1) * per])
            for i in range(calls - 1)]
    lines.append(f"  gap last kernel -> next call's first: median {statistics.median(gaps):.1f} us "
                 f"(min {min(gaps):.1f}, max {max(gaps):.1f})")
    span = (ev[-1][1] - ev[0][0]) / calls
    lines.append(f"  replay span per call {span:.1f} us")
    return "\n".join(lines)


def row_arg(text: str) -> str:
    """An argparse type: b,s_q,s_k,h_q[,varlen], else one line and exit status 2."""
    if not re.fullmatch(r"\d+,\d+,\d+,\d+(,varlen)?", text):
        raise argparse.ArgumentTypeError(f"row {text!r}: expected b,s_q,s_k,h_q[,varlen]")
    return text


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--row", action="append", required=True, help="b,s_q,s_k,h_q[,varlen]",
                    type=row_arg)
    ap.add_argument("--flashmla", default=None)
    ap.add_argument("--calls", type=int, default=20)
    a = ap.parse_args()
    live = None
    if a.flashmla:
        from mlagen.backends.hopper.flashmla_live import FlashMLACall, load

        live = load(a.flashmla)
    for row in a.row:
        f = row.split(",")
        b, s_q, sk, h_q = (int(x) for x in f[:4])
        c = bench.Caller(b, s_q, sk, h_q, len(f) > 4)
        print(f"row {row}: ours {bench.check_output(c)[0]}, eager {bench.time_eager(c) * 1e3:.1f} us, "
              f"eager back to back {bench.time_back_to_back(c, a.calls):.1f} us, "
              f"graph {bench.time_graph(c) * 1e3:.1f} us")
        print(summary(replay_events(c, a.calls), a.calls))
        if live is not None:
            fm = FlashMLACall(live, c)
            print(f"row {row}: FlashMLA {bench.check_output(fm)[0]}, eager "
                  f"{bench.time_eager(fm) * 1e3:.1f} us, eager back to back "
                  f"{bench.time_back_to_back(fm, a.calls):.1f} us, graph {bench.time_graph(fm) * 1e3:.1f} us")
            print(summary(replay_events(fm, a.calls), a.calls))
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
