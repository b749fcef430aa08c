"""Start-up time of the commands that need no kernel (issue 10: <= 0.3 s): the median wall
and CPU time of N fresh processes per command, and of `python -c pass` for reference.

    python benchmarks/startup.py [--runs 11]

Run from the project root.  The load average is printed too: on a shared machine the wall
time includes waiting for a core, the CPU time (user + sys) does not.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def measure(argv: list[str], runs: int, env: dict) -> tuple[float, float]:
    walls, cpus = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       cwd=ROOT, env=env, check=False)
        walls.append(time.perf_counter() - t0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return statistics.median(walls), statistics.median(cpus)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=11)
    args = ap.parse_args()
    out = tempfile.mkdtemp(prefix="mlagen-startup-")
    env = dict(os.environ, PYTHONPATH=str(ROOT), MLAGEN_CACHE_DIR=os.path.join(out, "cache"))
    cli = [sys.executable, "-m", "mlagen.cli"]
    cases = [("python -c pass", [sys.executable, "-c", "pass"]),
             ("mlagen --help", cli + ["--help"]),
             ("mlagen check schedules/sc11_fused_tp4.toml",
              cli + ["check", "schedules/sc11_fused_tp4.toml"]),
             ("mlagen generate schedules/sc11_fused_tp4.toml -o OUT",
              cli + ["generate", "schedules/sc11_fused_tp4.toml", "-o", out]),
             ("mlagen cache list", cli + ["cache", "list"])]
    print(f"load average before: {os.getloadavg()[0]:.2f}; {args.runs} runs each")
    print("| command | median wall (s) | median CPU (s) |")
    print("|---|---:|---:|")
    for name, argv in cases:
        wall, cpu = measure(argv, args.runs, env)
        print(f"| `{name}` | {wall:.3f} | {cpu:.3f} |")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
