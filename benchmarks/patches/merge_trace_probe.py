"""Per-CTA %globaltimer stamps of the 64-row split kernel's steps, one call in a graph (or
the last of 20 eager calls): a tree with merge_trace.patch applied (session 19, docs/hopper.md
step 31 (b)); not for main.  Give it a cache directory of its own: it reads the stamps from
the one library there that exports mlagen_trace_read.

    MLAGEN_CACHE_DIR=/tmp/trace-cache PYTHONPATH=$PWD python3 merge_trace_probe.py 32 1 1024 128 --graph
"""
import ctypes, glob, os, sys, statistics as stt
import torch
from mlagen.backends.hopper import defaults
from mlagen.backends.hopper.bench import Caller, check_output

b, sq, sk, hq = (int(x) for x in sys.argv[1:5])
graph = "--graph" in sys.argv
s = defaults.default_schedule(sq * hq)
c = Caller(b, sq, sk, hq, False, s)
print("check", check_output(c)[0])
libs = [l for l in glob.glob(os.environ["MLAGEN_CACHE_DIR"] + "/**/*.so", recursive=True)]
found = [h for h in map(ctypes.CDLL, libs) if hasattr(h, "mlagen_trace_read")]
assert len(found) == 1, f"one traced library expected under MLAGEN_CACHE_DIR: {libs}"
L = found[0]
def run():
    if graph:
        for _ in range(3): c()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(20): c()
        for _ in range(5): g.replay()
        torch.cuda.synchronize()
        L.mlagen_trace_clear(); torch.cuda.synchronize()
        g.replay()
    else:
        for _ in range(20): c()
    torch.cuda.synchronize()
run()
buf = (ctypes.c_ulonglong * (264 * 16))()
assert L.mlagen_trace_read(buf) == 0
tr = [[buf[i * 16 + k] for k in range(16)] for i in range(264)]
ctas = [t for t in tr if t[0]]
t0 = min(t[0] for t in ctas)
def rel(t, k):
    return (t[k] - t0) / 1000 if t[k] else None
print(f"mode {'graph' if graph else 'eager'} ctas {len(ctas)}; times in us from the first CTA's start")
names = ["start", "wg1 loop end", "wg2 loop end", "staged", "copy issued",
         "got", "merged", "stored", "exit", "rank|n", "wg2 stored"]
for k, n in enumerate(names):
    if k == 9: continue
    v = [rel(t, k) for t in ctas if t[k]]
    if v:
        print(f"  {n:24s} n={len(v):3d} min {min(v):6.2f} med {stt.median(v):6.2f} max {max(v):6.2f}")
# per CTA durations
def d(a, bb):
    v = [(t[bb] - t[a]) / 1000 for t in ctas if t[a] and t[bb]]
    return f"min {min(v):5.2f} med {stt.median(v):5.2f} max {max(v):5.2f}" if v else "-"
print("  loop (start->wg1 end)   ", d(0, 1))
print("  wg2 end - wg1 end       ", d(1, 2))
print("  wg1 end -> staged       ", d(1, 3))
print("  staged -> got           ", d(3, 5))
print("  got -> merged           ", d(5, 6))
print("  merged -> stored        ", d(6, 7))
print("  stored -> exit          ", d(7, 8))
print("  merged -> wg2 stored    ", d(6, 10))
print("  wg1 end -> stored       ", d(1, 7))
skew = []
for x in range(2):   # grid (2 row tiles, parts): CTA id = x + 2 y; a cluster is (x, y), (x, y^1)
    for y in range(0, 132, 2):
        a, bb = tr[x + 2 * y], tr[x + 2 * (y + 1)]
        if a[1] and bb[1]:
            skew.append(abs(a[1] - bb[1]) / 1000)
if skew:
    print(f"  pair loop-end skew      min {min(skew):5.2f} med {stt.median(skew):5.2f} max {max(skew):5.2f} (n={len(skew)})")
ends = [max(t[k] for k in range(9) if t[k]) for t in ctas]
print(f"  kernel span {(max(ends) - t0) / 1000:.2f} us")
