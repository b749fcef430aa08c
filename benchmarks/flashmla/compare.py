"""mlagen and FlashMLA (built on the device by build.sh) on the same tensors, GPU only:
one row at the power cap, each in turn (clock, watts, work per GHz), or N calls of one side
for ncu.  The 51 rows and the graph rows side by side are `mlagen bench --flashmla LIB`
(this script's table mode until 2026-12-02; its results are under benchmarks/results/).

    FM_LIB=.../libflashmla.so PYTHONPATH=$PWD python benchmarks/flashmla/compare.py \
        --power [B S_Q SK H_Q [--varlen]]
    ... compare.py --one fm|ours B S_Q SK H_Q [--varlen] [--calls N]   (for ncu: N calls)
"""

from __future__ import annotations

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


USAGE = ("usage: compare.py --power [B S_Q SK H_Q [--varlen]] | "
         "--one fm|ours B S_Q SK H_Q [--varlen] [--calls N]")


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


def power(args: list[str]) -> None:
    """Each in turn at the power cap on one row (clock, watts, work per GHz), twice."""
    from power_probe import steady

    try:
        b, s_q, sk, h_q = map(int, args[:4]) if args else (128, 1, 8192, 128)
    except ValueError:
        print(USAGE, file=sys.stderr)
        sys.exit(2)
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(f"power, b={b} s_q={s_q} sk={sk} h_q={h_q}, 2.5 s each, in turn:")
    c = bench.Caller(b, s_q, sk, h_q, "--varlen" in args)
    f = FlashMLACaller(c)
    fl, _ = bench.flops_bytes(b, s_q, h_q, c.lens)
    for rnd in range(2):
        for name, fn in (("ours", c), ("fm", f)):
            time.sleep(1.0)
            print(f"  {name} r{rnd}: {steady(fn, fl, 2.5)}", flush=True)


def main() -> None:
    if sys.argv[1:2] == ["--one"]:
        one(sys.argv[2:])
    elif sys.argv[1:2] == ["--power"]:
        power(sys.argv[2:])
    else:
        print(USAGE, file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    try:
        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA device: compare.py runs on the GPU machine")
        main()
    except (RuntimeError, MlagenError) as e:
        print(f"compare.py: {e}", file=sys.stderr)
        sys.exit(2)
