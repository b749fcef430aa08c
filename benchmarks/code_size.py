"""SASS instructions of each example schedule's split kernel (nvcc only, no GPU): the table
to read before and after a change meant to shrink (or not grow) the kernels.

    python benchmarks/code_size.py [example ...]
"""

from __future__ import annotations

import re
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mlagen.backends.hopper import render  # noqa: E402
from mlagen.backends.hopper.codesize import compile_cubin, kernel_instructions  # noqa: E402
from mlagen.paths import SCHEDULES_DIR, TEMPLATES_DIR  # noqa: E402
from mlagen.schedule import load  # noqa: E402


def size(example: str, tmp: Path) -> tuple[str, dict[str, int]]:
    src = render(load(SCHEDULES_DIR / f"{example}.toml"))
    cu = tmp / f"{example}.cu"
    cu.write_text(src.files["split.cu"])
    cubin = compile_cubin(cu, TEMPLATES_DIR / "hopper" / "include", src.flags,
                          tmp / f"{example}.cubin")
    return example, kernel_instructions(cubin)


def main() -> None:
    names = sys.argv[1:] or sorted(p.stem for p in SCHEDULES_DIR.glob("hopper_*.toml"))
    with tempfile.TemporaryDirectory() as d, ThreadPoolExecutor(4) as ex:
        rows = list(ex.map(lambda n: size(n, Path(d)), names))
    print("| example | kernel | SASS instructions |\n|---|---|---|")
    for example, kernels in rows:
        for sym, n in sorted(kernels.items()):
            short = re.search(r"mla_\w+?_kernel", sym)
            print(f"| {example} | {short.group(0) if short else sym} | {n} |")


if __name__ == "__main__":
    main()
