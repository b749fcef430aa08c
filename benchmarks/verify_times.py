"""`mlagen verify`'s time per example schedule, one schedule at a time, as a user runs it,
against the bars of a check run on every change (smoke <= 30 s a schedule, ci <= 90 s).

    python benchmarks/verify_times.py --target hopper --profile smoke
    python benchmarks/verify_times.py --profile ci schedules/hopper_h200.toml ...

Each schedule runs in a fresh `mlagen verify ... --json` process: the whole command's wall
time includes its imports and, on a cold build cache, the family's builds.  Its JSON result
says where the rest went (runner ready; the examples' inputs, reference, kernel calls and
comparison).  Writes benchmarks/results/verify_times_<device>_<commit>.json (--commit: the
tree's commit where git cannot tell it, as on a copied tree) and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))   # run from a checkout

from mlagen.examples import example_schedules  # noqa: E402
from mlagen.schedule import load  # noqa: E402

BARS = {"smoke": 30.0, "ci": 90.0}


def device_name() -> str:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return "cpu"


def device_tag(name: str) -> str:
    """The records' device word: the name's words, lower case, without the vendor."""
    return "_".join(w.lower() for w in name.split() if w.upper() != "NVIDIA")


def one(schedule: Path, profile: str, timeout_s: float, tmp: Path) -> dict:
    dest = tmp / f"{schedule.stem}_{profile}.json"
    argv = [sys.executable, "-m", "mlagen.cli", "verify", str(schedule), "--profile", profile,
            "--no-progress", "--json", str(dest)]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
        rc, tail = proc.returncode, (proc.stderr.strip().splitlines() or [""])[-1]
    except subprocess.TimeoutExpired:
        rc, tail = None, f"no result within {timeout_s:g} s"
    wall = time.perf_counter() - t0
    row = dict(schedule=schedule.stem, profile=profile, rc=rc, wall_s=round(wall, 2))
    if dest.is_file():
        rec = json.loads(dest.read_text())
        row.update(ok=rec["ok"], examples=rec["examples_run"], examples_s=rec["elapsed_s"],
                   setup_s=rec["setup_s"], phase_s=rec["phase_s"],
                   workers_ready_s=rec["workers_ready_s"], runner_made_s=rec["runner_made_s"],
                   budget_spent=rec["budget_spent"],
                   failure=rec["failure"]["message"].splitlines()[0] if rec["failure"] else "")
    else:
        row.update(ok=False, failure=tail)
    return row



def _argv_without_out() -> list[str]:
    """The command line as recorded: --out's folder is the record's own place, a path of
    one machine (the record lives in benchmarks/results/ wherever it was written)."""
    out, skip = [], False
    for arg in sys.argv[1:]:
        if skip:
            skip = False
        elif arg == "--out":
            skip = True
        elif not arg.startswith("--out="):
            out.append(arg)
    return out

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("schedules", nargs="*", type=Path,
                    help="schedule files (default: the target's example schedules)")
    ap.add_argument("--target", default="hopper", help="whose examples (default hopper)")
    ap.add_argument("--profile", action="append", choices=sorted(BARS),
                    help="smoke and/or ci (default smoke)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds a run (600)")
    ap.add_argument("--commit", default=None, help="the tree's commit (default: git's)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results",
                    help="folder of the record")
    a = ap.parse_args()
    if not a.out.is_dir():
        print(f"verify_times: --out {a.out}: no such folder", file=sys.stderr)
        return 2
    scheds = a.schedules or [p for p in example_schedules()
                             if load(p).target.kind == a.target]
    profiles = a.profile or ["smoke"]
    commit = a.commit or subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=ROOT,
                                        text=True, capture_output=True).stdout.strip()
    dev = device_name()
    date = subprocess.run(["git", "show", "-s", "--format=%cI", commit], cwd=ROOT, text=True,
                          capture_output=True).stdout.strip() or "unknown"
    path = a.out / f"verify_times_{device_tag(dev)}_{commit}.json"
    rows = []

    def write() -> None:
        # after every run: a run cut short by a time limit keeps the rows it finished
        rec = dict(commit=commit, commit_date=date, device=dev, bars_s=BARS,
                   command="python benchmarks/verify_times.py " + " ".join(_argv_without_out()),
                   note="one schedule at a time, each a fresh `mlagen verify --json` process; "
                        "wall_s: the whole command (imports, builds on a cold cache, workers, "
                        "examples); examples_s: the examples alone; setup_s: runner ready",
                   runs=rows)
        path.write_text(json.dumps(rec, indent=1) + "\n")

    print("| schedule | profile | result | whole command (s) | examples (s) | examples | "
          "runner ready (s) | kernel / inputs / reference / compare (s) |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for prof in profiles:
            for s in scheds:
                r = one(s, prof, a.timeout, Path(tmp))
                rows.append(r)
                write()
                ph = r.get("phase_s") or {}
                parts = " / ".join(f"{ph.get(k, 0):.1f}"
                                   for k in ("kernel", "inputs", "reference", "compare"))
                print(f"| {r['schedule']} | {prof} | {'PASS' if r['ok'] else 'FAIL'} | "
                      f"{r['wall_s']:.1f} | {r.get('examples_s', 0):.1f} | "
                      f"{r.get('examples', 0)} | {r.get('setup_s', 0):.1f} | {parts} |",
                      flush=True)
    print(f"record: {path}")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
