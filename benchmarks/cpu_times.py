"""Start-up and build times on a CPU machine, the figures of record for the commands that
need no kernel (bar: <= 0.3 s for --help, check, generate and cache) and for cold builds.

    python benchmarks/cpu_times.py [--runs 11]

writes the record benchmarks/results/cpu_times_cpu_<commit>.json.

Run from the project root.  Start-up: the median wall and CPU (user + sys) time of N fresh
processes per command, and of `python -c pass` for reference; the load average is recorded
too (on a shared machine the wall time includes waiting for a core, the CPU time does not).
Builds: `mlagen build SCHEDULE` into an empty cache, wall time of the command (torch's
import included) and the build time it prints ("built in X s").
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILDS = ("schedules/sc11_fused_tp4.toml", "schedules/sc11_attn.toml")


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


def cold_build(schedule: str, env: dict) -> dict:
    cache = tempfile.mkdtemp(prefix="mlagen-build-")
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "mlagen.cli", "build", schedule], cwd=ROOT,
                          env=dict(env, MLAGEN_CACHE_DIR=cache), check=True,
                          capture_output=True, text=True)
    wall = time.perf_counter() - t0
    found = re.search(r": built in ([0-9.]+) s", proc.stdout)
    return {"schedule": schedule, "wall_s": wall,
            "build_s": float(found.group(1)) if found else None}


def commit_date(commit: str) -> str:
    return subprocess.run(["git", "show", "-s", "--format=%cI", commit], cwd=ROOT, text=True,
                          capture_output=True).stdout.strip()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=11)
    ap.add_argument("--out", default=None)
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
    load_before = os.getloadavg()[0]
    startup = []
    for name, argv in cases:
        wall, cpu = measure(argv, args.runs, env)
        startup.append({"command": name, "wall_s": wall, "cpu_s": cpu})
        print(f"{name}: wall {wall:.3f} s, CPU {cpu:.3f} s", flush=True)
    builds = [cold_build(s, env) for s in BUILDS]
    for b in builds:
        print(f"cold build {b['schedule']}: {b['wall_s']:.1f} s wall, "
              f"{b['build_s']} s build", flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                            capture_output=True).stdout.strip()
    rec = {"commit": commit, "commit_date": commit_date(commit), "device": "cpu",
           "cores": os.cpu_count(),
           "machine": platform.machine(), "python": platform.python_version(),
           "command": "python benchmarks/cpu_times.py" + (f" --runs {args.runs}"
                                                          if args.runs != 11 else ""),
           "runs": args.runs, "load_average": [load_before, os.getloadavg()[0]],
           "startup": startup, "builds": builds}
    path = Path(args.out) if args.out else ROOT / "benchmarks" / "results" / \
        f"cpu_times_cpu_{commit}.json"
    path.write_text(json.dumps(rec, indent=1) + "\n")
    print(f"written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
