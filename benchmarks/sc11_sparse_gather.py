"""The sparse SC11 gather with a descriptor a token against a descriptor a run of adjacent
slots (`gather = "token"` / `"runs"`), simulated, on random and windowed index lists
(mlagen/backends/sc11/sparse_bench.py: its points and patterns).

    python benchmarks/sc11_sparse_gather.py           # a markdown table
    python benchmarks/sc11_sparse_gather.py --quick   # batch 2 only
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # run from a checkout

from mlagen.backends.sc11.sparse_bench import INDICES, POINTS, sparse_row  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="batch 2 only")
    args = ap.parse_args()
    us = 1e6
    print("| schedule | batch | indices | token: time (us) | descriptors | runs: time (us) | "
          "descriptors | floor (us) | best scheme (runs) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for pt in POINTS:
        if args.quick and pt[1] > 2:
            continue
        for ix in INDICES:
            t, r = (sparse_row(*pt, indices=ix, gather=g) for g in ("token", "runs"))
            print(f"| {pt[0]} | {pt[1]} | {ix} | {t.time_s * us:.1f} | {t.descriptors} | "
                  f"{r.time_s * us:.1f} | {r.descriptors} | {r.floor_s * us:.1f} | "
                  f"{r.scheme} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
