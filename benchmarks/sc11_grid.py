"""The SC11 Table 2: best multi-core scheme by batch and sequence length, and the seed's
double-buffering claim at batch 128, seqlen 512 (simulated; see docs/sc11-cost-model.md).

    python benchmarks/sc11_grid.py                    # full grid, writes benchmarks/results/
    python benchmarks/sc11_grid.py --quick            # 3 x 3 grid
    python benchmarks/sc11_grid.py --schedule my.toml --out /tmp/grid.md --charts /tmp/charts
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))      # run from a checkout without installing

from mlagen.backends.sc11 import bench  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--schedule", default=None, help="schedule file (default: "
                    "schedules/sc11_fused_tp4.toml)")
    ap.add_argument("--out", default=str(HERE / "results" / "sc11_grid.md"))
    ap.add_argument("--charts", default=str(HERE / "results" / "sc11_charts"))
    ap.add_argument("--quick", action="store_true", help="batch {1,16,128} x seqlen "
                    "{128,1024,16384}")
    ap.add_argument("--no-grid", action="store_true", help="only the seed's point")
    a = ap.parse_args(argv)

    a.output = a.out
    return bench.bench_main(a)

if __name__ == "__main__":
    sys.exit(main())
