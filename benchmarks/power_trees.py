"""One tree's decode call in steady state at the power cap: ~2.5 s back to back while
`nvidia-smi` samples the SM clock and power (power_probe.steady), so that trees whose
kernels differ can be compared at the clock each one actually runs (GPU only).

    for r in 1 2; do for t in base x; do (cd ../$t && PYTHONPATH=$PWD \\
      python3 benchmarks/power_trees.py $PWD); done; done     [b s_q sk h_q, default 128 1 8192 128]
"""

from __future__ import annotations

import sys


def main() -> None:
    args = sys.argv[1:]
    try:
        if len(args) not in (1, 5):
            raise ValueError
        tree = args[0]
        b, s_q, sk, h_q = (int(x) for x in (args[1:5] or (128, 1, 8192, 128)))
    except ValueError:
        print("usage: power_trees.py TREE_DIR [b s_q sk h_q]", file=sys.stderr)
        sys.exit(2)
    sys.path.insert(0, tree)
    sys.path.insert(0, tree + "/benchmarks")
    from power_probe import steady

    from mlagen.backends.hopper import bench

    c = bench.Caller(b, s_q, sk, h_q, False)
    flops, _ = bench.flops_bytes(b, s_q, h_q, c.lens)
    c()
    print(tree.rstrip("/").split("/")[-1], steady(c, flops, 2.5), flush=True)


if __name__ == "__main__":
    main()
