"""The SC11 figures of record (simulated; docs/sc11-cost-model.md): the seed's point (every
scheme at 1 and 2 buffers, the pipelined bound, the hardware floor per segment) and the
best multi-core scheme by batch and sequence length.

    python benchmarks/sc11_grid.py              # the record: results/sc11_grid_cpu_<commit>.json
    python benchmarks/sc11_grid.py --quick --out F.json     # a 3 x 3 grid

The full text report, with every scheme's time, timelines and the sensitivity table, is
`mlagen bench --target sc11 --output FILE.md`.  BENCHMARKS.md's SC11 table is generated from
the JSON (benchmarks/report.py).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))      # run from a checkout without installing

from mlagen.backends.sc11 import bench  # noqa: E402
from mlagen.backends.sc11.floors import phase_floors  # noqa: E402


def commit() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, text=True,
                          capture_output=True).stdout.strip()


def record(seed, grid, command: str, at: str) -> dict:
    d = seed.sims[(2, seed.scheme)]
    return {
        "commit": at, "commit_date": commit_date(at), "device": "cpu",
        "machine": platform.processor() or platform.machine(), "command": command,
        "schedule": grid.schedule,
        "assumed": grid.assumed,
        "seed": {"batch": seed.point.batch, "seqlen": seed.point.seqlen,
                 "scheme": seed.scheme, "single_us": seed.single * 1e6,
                 "double_us": seed.double * 1e6, "saving": seed.saving,
                 "pipelined_us": seed.pipelined * 1e6, "floor_us": seed.floor * 1e6,
                 "schemes": {f"{s}|{nb}": r.total_s * 1e6 for (nb, s), r in seed.sims.items()},
                 "segments": [{"phases": s.phases, "us": s.time_s * 1e6,
                               "ddr_mb": s.ddr_bytes / 1e6, "floor_us": s.floor_s * 1e6,
                               "busiest": s.busiest} for s in phase_floors(d)],
                 "checks": seed.checks()},
        "grid": [{"batch": p.batch, "seqlen": p.seqlen,
                  "best": {str(nb): list(p.best(nb)) for nb in grid.buffers},
                  "auto": {str(k): v for k, v in p.auto.items()},
                  "bound_us": {str(k): v * 1e6 for k, v in p.bound.items()},
                  "dominant": {str(k): v for k, v in p.dominant.items()}}
                 for p in grid.points],
        "grid_seconds": grid.seconds,
    }


def commit_date(commit: str) -> str:
    return subprocess.run(["git", "show", "-s", "--format=%cI", commit], cwd=HERE, text=True,
                          capture_output=True).stdout.strip()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--schedule", default=None, help="schedule file (default: "
                    "schedules/sc11_fused_tp4.toml)")
    ap.add_argument("--out", default=None, help="the JSON record (default: "
                    "benchmarks/results/sc11_grid_cpu_<commit>.json)")
    ap.add_argument("--quick", action="store_true", help="batch {1,16,128} x seqlen "
                    "{128,1024,16384}")
    a = ap.parse_args(argv)
    if a.quick and a.out is None:
        ap.error("--quick is not the record: name its file with --out")
    at = commit()           # the code that runs: read before, not after, the minutes it takes
    seed = bench.seed_point(a.schedule)
    kw = dict(batches=(1, 16, 128), seqlens=(128, 1024, 16384)) if a.quick else {}
    grid = bench.bench_grid(a.schedule, progress=lambda line: print(line, file=sys.stderr),
                            **kw)
    rec = record(seed, grid, "python benchmarks/sc11_grid.py" + (" --quick" if a.quick else ""), at)
    out = Path(a.out) if a.out else HERE / "results" / f"sc11_grid_cpu_{rec['commit']}.json"
    out.write_text(json.dumps(rec, indent=1) + "\n")
    print(f"written: {out}")
    return 0 if all(seed.checks().values()) else 1


if __name__ == "__main__":
    sys.exit(main())
