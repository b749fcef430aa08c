"""`mlagen bench --target hopper`: FlashMLA's sweep against the anchor, on a GPU.

The sweep itself is benchmarks/hopper_sweep.py (the script the GPU visits run); this entry
point runs it from the CLI with the same arguments."""

from __future__ import annotations

import runpy
import sys

from ...errors import MlagenError
from ...paths import DATA_ROOT


def bench_main(args) -> int:
    from .. import backend       # the registry (hopper.backend imports this module)

    why = backend("hopper").device_check()
    if why:   # "target hopper needs ...": said as the bench command's own words
        raise MlagenError("bench --" + why.split(";")[0] + "; the other targets' "
                          "benchmarks run anywhere")
    script = DATA_ROOT / "benchmarks" / "hopper_sweep.py"
    if not script.exists():
        raise MlagenError(f"{script} is missing: the sweep runs from a source checkout")
    argv = [str(script)] + (["--out", args.output] if args.output else []) + \
        (["--rows", "12"] if args.quick else [])
    old, sys.argv = sys.argv, argv
    try:
        runpy.run_path(str(script), run_name="__main__")
    finally:
        sys.argv = old
    return 0
