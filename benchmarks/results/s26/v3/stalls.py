"""The stall samples of s26 v3's two ncu reports side by side: totals by reason, and every
warpgroup wait or named barrier with more than 50 samples (offsets from the kernel's start).
    python benchmarks/results/s26/v3/stalls.py"""
import csv
import gzip
from pathlib import Path

HERE = Path(__file__).parent
ALL = "Warp Stall Sampling (All Samples)"


def load(tree):
    rows = list(csv.reader(gzip.open(HERE / f"sass_{tree}.csv.gz", "rt")))
    hdr = rows[1]
    return [dict(zip(hdr, r)) for r in rows[2:] if len(r) == len(hdr)]


def n(r, k):
    return int(r[k] or 0)


trees = {t: load(t) for t in ("main", "rs")}
reasons = [k for k in next(iter(trees.values()))[0] if k.startswith("stall_") and "(" not in k]
print("| reason | main | rs | rs - main |\n|---|---:|---:|---:|")
for k in ["all"] + reasons:
    a, b = (sum(n(r, ALL if k == "all" else k) for r in trees[t]) for t in ("main", "rs"))
    if a or b:
        print(f"| {k} | {a} | {b} | {b - a:+d} |")
for t, body in trees.items():
    base = int(body[0]["Address"], 16)
    print(f"\n{t}: waits and barriers")
    for r in body:
        s = r["Source"].strip()
        if ("DEPBAR" in s or "BAR." in s) and n(r, ALL) > 50:
            print(f"  {int(r['Address'], 16) - base:6x} {n(r, ALL):6d}  {s}")
