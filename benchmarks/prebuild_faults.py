"""Build, in parallel, every library tests/test_hopper_faults.py loads (each example with and
without its planted fault, as the API canonicalizes them), so that the visit's fault tests
find them in the cache instead of building ~25 libraries one after the other (GPU machine;
nvcc only, no GPU needed).

    python benchmarks/prebuild_faults.py [JOBS]
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from mlagen.backends.hopper import defaults  # noqa: E402
from mlagen.backends.hopper.tune import build_schedules  # noqa: E402
from mlagen.paths import SCHEDULES_DIR  # noqa: E402
from mlagen.schedule import load  # noqa: E402
from test_hopper_faults import EXAMPLES, FAULTED  # noqa: E402


def main() -> None:
    jobs = int(sys.argv[1]) if len(sys.argv) > 1 else 16
    scheds = [load(SCHEDULES_DIR / f"{e}.toml").with_fault(f) for f, e in FAULTED]
    scheds += [load(SCHEDULES_DIR / f"{e}.toml") for e in EXAMPLES]
    canon = {c.variant_name(): c for c in (defaults.canonical(s) for s in scheds)}
    t = time.time()
    errs = build_schedules(list(canon.values()), jobs)
    for name, e in zip(canon, errs):
        print(name, e or "ok")
    print(f"{len(canon)} libraries in {time.time() - t:.1f} s, {sum(map(bool, errs))} failed")
    sys.exit(1 if any(errs) else 0)


if __name__ == "__main__":
    main()
