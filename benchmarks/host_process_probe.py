"""Is the host time per decode call a property of the code or of the process?  One fresh
process each run: a pure-Python calibration loop (ns per iteration: how fast this process's
CPU is right now), then bench.host_time() (the bench of record's figure), optionally after
importing what `mlagen bench` imports (--cli) or with the cyclic GC off (--nogc).

    python benchmarks/host_process_probe.py [--cli] [--nogc]
"""

from __future__ import annotations

import gc
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def calibrate(n: int = 2_000_000) -> float:
    t0 = time.perf_counter()
    x = 0
    for i in range(n):
        x += i & 7
    return (time.perf_counter() - t0) / n * 1e9


def main():
    if "--cli" in sys.argv:
        import mlagen.cli  # noqa: F401
        import rich.progress  # noqa: F401
        import triton.testing  # noqa: F401
    if "--nogc" in sys.argv:
        gc.disable()
    from mlagen.backends.hopper import bench, fastcall

    before = calibrate()
    host = bench.host_time()
    print(json.dumps(dict(args=sys.argv[1:], fastcall=fastcall.module() is not None,
                          calib_ns_before=round(before, 1), calib_ns_after=round(calibrate(), 1),
                          decode_us=host["decode_us"], decode_rounds_us=host["decode_rounds_us"],
                          md_decode_rounds_us=host["metadata_and_decode_rounds_us"])))


if __name__ == "__main__":
    main()
