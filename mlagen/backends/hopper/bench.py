"""`mlagen bench --target hopper`: FlashMLA's sweep against the anchor, on a GPU.

The sweep itself is benchmarks/hopper_sweep.py (the script the GPU visits run); this entry
point runs it from the CLI with the same arguments."""

from __future__ import annotations

import runpy
import sys

from ...errors import MlagenError
from ...paths import DATA_ROOT


def bench_main(args) -> int:
    import torch

    if not torch.cuda.is_available():
        raise MlagenError("mlagen bench --target hopper needs an NVIDIA GPU (sm_90); none "
                          "was found")
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
