"""mlagen and FlashMLA (built on the device by build.sh) on the same tensors, timed in
turn within one process: the anchor's 51 rows eager, the 8 graph rows in CUDA graphs, and
one row at the power cap (clock, watts, energy per call).  GPU only.

    FM_LIB=.../libflashmla.so PYTHONPATH=$PWD python benchmarks/flashmla/compare.py [--quick]
    ... compare.py --one fm|ours b s_q sk h_q [--varlen] [--calls N]   (for ncu: N calls)
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import torch  # noqa: E402

from fm import FlashMLACaller  # noqa: E402
from mlagen.backends.hopper import bench  # noqa: E402
from mlagen.errors import MlagenError  # noqa: E402


USAGE = "usage: compare.py [--quick] | --one fm|ours B S_Q SK H_Q [--varlen] [--calls N]"


def one(args: list[str]) -> None:
    try:
        if len(args) < 5 or args[0] not in ("fm", "ours"):
            raise ValueError
        which, b, s_q, sk, h_q = args[0], *map(int, args[1:5])
        calls = int(args[args.index("--calls") + 1]) if "--calls" in args else 4
    except (ValueError, IndexError):
        print(USAGE, file=sys.stderr)
        sys.exit(2)
    c = bench.Caller(b, s_q, sk, h_q, "--varlen" in args)
    f = FlashMLACaller(c) if which == "fm" else c
    for _ in range(calls):
        f()
    torch.cuda.synchronize()


def eager_pair(c, f, rounds: int = 2) -> tuple[float, float]:
    a, b = [], []
    for _ in range(rounds):
        a.append(bench.time_eager(c))
        b.append(bench.time_eager(f))
    return statistics.median(a), statistics.median(b)


def main() -> None:
    if sys.argv[1:2] == ["--one"]:
        one(sys.argv[2:])
        return
    if any(a != "--quick" for a in sys.argv[1:]):
        print(USAGE, file=sys.stderr)
        sys.exit(2)
    quick = "--quick" in sys.argv
    from power_probe import steady

    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    rows = bench.anchor_rows()
    if quick:
        rows = [r for r in rows if r["b"] == 128 and r["s_q"] * r["h_q"] >= 64][:4]
    print("| b | s_q | sk | h_q | varlen | check ours / fm | ours ms | fm ms | fm/ours | "
          "anchor fm ms | fm today / anchor |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    checked = 0
    for r in rows:
        c = bench.Caller(r["b"], r["s_q"], r["sk"], r["h_q"], bool(r["varlen"]))
        f = FlashMLACaller(c)
        chk = "-"
        if checked < 6 or r["sk"] <= 1024:
            chk = f"{bench.check_output(c)[0]} / {bench.check_output(f)[0]}"
            checked += 1
        o, m = eager_pair(c, f)
        print(f"| {r['b']} | {r['s_q']} | {r['sk']} | {r['h_q']} | {int(r['varlen'])} | {chk} | "
              f"{o:.4f} | {m:.4f} | {m / o:.3f} | {r['flashmla_ms']} | "
              f"{m / r['flashmla_ms']:.3f} |", flush=True)
        del c, f
    print("\n| graph row | ours us | fm us | fm/ours | anchor fm us |")
    print("|---|---|---|---|---|")
    for g in bench.graph_rows():
        c = bench.Caller(g["b"], g["s_q"], g["sk"], g["h_q"], bool(g["varlen"]))
        f = FlashMLACaller(c)
        o1, m1 = bench.time_graph(c) * 1e3, bench.time_graph(f) * 1e3
        o2, m2 = bench.time_graph(c) * 1e3, bench.time_graph(f) * 1e3
        o, m = min(o1, o2), min(m1, m2)
        print(f"| {g['b']} {g['s_q']} {g['sk']} {g['h_q']}{' varlen' if g['varlen'] else ''} | "
              f"{o:.1f} | {m:.1f} | {m / o:.3f} | {g['flashmla_graph_us']} |", flush=True)
        del c, f
    print("\npower, b=128 s_q=1 sk=8192 h_q=128, 2.5 s each, in turn:")
    c = bench.Caller(128, 1, 8192, 128, False)
    f = FlashMLACaller(c)
    fl, _ = bench.flops_bytes(128, 1, 128, c.lens)
    for rnd in range(2):
        for name, fn in (("ours", c), ("fm", f)):
            time.sleep(1.0)
            print(f"  {name} r{rnd}: {steady(fn, fl, 2.5)}", flush=True)


if __name__ == "__main__":
    try:
        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA device: compare.py runs on the GPU machine")
        main()
    except (RuntimeError, MlagenError) as e:
        print(f"compare.py: {e}", file=sys.stderr)
        sys.exit(2)
