"""Honest SC11 figures (simulated): the seed point beside its hardware floor, the
double-buffer saving as a range over the plausible readings of each assumed parameter (table
and chart), auto's worst regret across those readings, and the card as two chips.

    python benchmarks/sc11_ranges.py            # prints the report (about 2 minutes)
    python benchmarks/sc11_ranges.py --out FILE.md --chart DIR/saving_range
    python benchmarks/sc11_ranges.py --quick    # a smaller regret grid

docs/sc11-cost-model.md quotes its figures.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))      # run from a checkout without installing

from mlagen.backends.sc11 import bench, ranges  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="also write the report to this file")
    ap.add_argument("--chart", default=None, help="write the saving-range chart here")
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, text=True,
                            capture_output=True).stdout.strip()
    seed = bench.seed_point()
    d = seed.sims[(2, seed.scheme)]
    parts = [f"# SC11 figures with their floors and ranges (simulated, commit {commit})", "",
             "Command: `python benchmarks/sc11_ranges.py`.  Every time is the cost model's "
             "(costmodel.py on targets/sc11.toml); nothing was measured on a card.", "",
             f"## The seed point (batch 128, seqlen 512, 32 heads on one chip, "
             f"{seed.scheme} scheme, 2 buffers): {seed.double * 1e6:.1f} us, "
             f"floor {seed.floor * 1e6:.1f} us, {seed.double / seed.floor:.2f}x", "",
             ranges.floors_table(d), "",
             "Single-buffered, same scheme:", "",
             ranges.floors_table(seed.sims[(1, seed.scheme)])]
    sr = ranges.saving_range()
    parts += ["", "## The double-buffer saving over the readings of the assumed parameters", "",
              sr.markdown()]
    if a.chart:
        parts += ["", "chart: " + ", ".join(str(f) for f in sr.chart(Path(a.chart)))]
    kw = dict(batches=(1, 16, 128), seqlens=(128, 1024)) if a.quick else {}
    reg = ranges.auto_regret(progress=lambda s: print(s, file=sys.stderr), **kw)
    parts += ["", "## auto judged across readings (regret against the best scheme under "
              "each)", "", f"grid: batch {sorted({r[0] for r in reg.rows})} x seqlen "
              f"{sorted({r[1] for r in reg.rows})}; auto picks with the default reading", "",
              reg.markdown()]
    card = ranges.card_report()
    parts += ["", "## The card as two chips", "", card.markdown(128, 512)]
    parts += ["", f"(written in {time.perf_counter() - t0:.0f} s)"]
    text = "\n".join(parts) + "\n"
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
