"""Graph time (us) per call of a few explicit hopper schedules against the per-shape default, on
chosen rows (each output checked against the reference first).  For questions such as
"would the few-rows kernel without splits beat the split 64-row kernel at b = 32?".

    python benchmarks/schedule_probe.py --row 32,1,1024,128 --row 16,2,2048,64 \
        --sched r32_w8_s1 --sched r64_w8_s1 [--rounds 2]

A schedule name is r{rows}_w{warps}_s{split_kv or auto}[_c{split_cost}]; wgmma, 64-key
blocks, two buffers.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import mlagen.schedule  # noqa: E402,F401  (Schedule.build)
from mlagen.backends.hopper import bench  # noqa: E402
from mlagen.schedule.records import Schedule  # noqa: E402


NAME = re.compile(r"r(\d+)_w(\d+)_s(auto|\d+)(?:_c(\d+))?")
ROW = re.compile(r"\d+,\d+,\d+,\d+(,varlen)?")


def checked(pattern: re.Pattern, what: str):
    """An argparse type: the argument if it matches, else one line and exit status 2."""
    def check(text: str) -> str:
        if not pattern.fullmatch(text):
            raise argparse.ArgumentTypeError(f"{what} {text!r}: expected {pattern.pattern}")
        return text
    return check


def schedule_of(name: str):
    if name == "default":
        return None
    r, w, s, c = NAME.fullmatch(name).groups()
    knobs = dict(rows_per_tile=int(r), warps=int(w), mainloop="wgmma", block_kv=64, buffers=2,
                 split_kv=s if s == "auto" else int(s))
    if c:
        knobs["split_cost"] = int(c)
    return Schedule.build(name=name, target="hopper", **knobs)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--row", action="append", required=True, help="b,s_q,s_k,h_q[,varlen]",
                    type=checked(ROW, "row"))
    ap.add_argument("--sched", action="append", default=[], type=checked(NAME, "schedule"))
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    names = ["default"] + a.sched
    print("| row | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for row in a.row:
        f = row.split(",")
        b, s_q, sk, h_q = (int(x) for x in f[:4])
        varlen = len(f) > 4
        data = bench.workload(b, s_q, sk, h_q, varlen)
        callers = {}
        for n in names:
            try:
                c = bench.Caller(b, s_q, sk, h_q, varlen, schedule_of(n), data=data)
                why, _, _ = bench.check_output(c)
            except Exception as e:    # an illegal schedule for this row: say so, go on
                why = f"{type(e).__name__}: {str(e)[:80]}"
            callers[n] = c if why == "ok" else why
        best = {n: float("inf") for n in names}
        for _ in range(a.rounds):
            for n, c in callers.items():
                if not isinstance(c, str):
                    best[n] = min(best[n], bench.time_graph(c))
        cells = [callers[n] if isinstance(callers[n], str) else f"{best[n] * 1e3:.1f}" for n in names]
        print(f"| {row} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
