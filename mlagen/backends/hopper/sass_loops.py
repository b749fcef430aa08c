"""A Hopper kernel's loops in SASS, by warpgroup, on a machine with nvcc and no GPU: what a
change does to the instructions each warpgroup spends on a block, before a GPU times it.
Renders each schedule's split.cu, builds it to an sm_90a cubin with the JIT's flags (less
-lineinfo), disassembles it (cuobjdump: $MLAGEN_CUOBJDUMP, on PATH, beside nvcc, or the one
benchmarks/sass_dump.sh fetched), and prints for each kernel its register regions (each
setmaxnreg's count and where it stands) and its loops (a backward branch over at least --min
instructions): their span, the region they start in, their commonest opcodes.

    python -m mlagen.backends.hopper.sass_loops schedules/hopper_fp8_e4m3_r64.toml
    python -m mlagen.backends.hopper.sass_loops --kernel Lb1 --mix 12 SCHEDULE...

Static counts: a loop's span includes paths it seldom takes (a NaN fix-up inside it), so
compare opcode mixes as well as spans.  Exit 0; 2: bad input (no nvcc or no cuobjdump, a
schedule that is not a Hopper one or does not build), in one line.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import MlagenError
from ...schedule import load
from . import render
from .codesize import INSTRUCTION_BYTES, compile_cubin

_FUNCTION = re.compile(r"^\s*Function : (\S+)", re.M)
_INSTRUCTION = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", re.M)
_PREDICATE = re.compile(r"^@!?U?P(?:T|\d+)\s+")
_BRANCH = re.compile(r"\bBRA(?:\.[\w.]+)?\s+(?:U?!?P(?:T|\d+),\s*)?0x([0-9a-f]+)\b")
_SETMAXNREG = "USETMAXREG"


class Refused(Exception):
    """Bad input: one line, exit 2."""


@dataclass
class Loop:
    start: int          # the branch target (byte address)
    end: int            # the backward branch's own address
    region: int | None  # the register count of the setmaxnreg before start (None: none)
    mix: Counter = field(default_factory=Counter)

    @property
    def instructions(self) -> int:
        return (self.end - self.start) // INSTRUCTION_BYTES + 1


@dataclass
class Kernel:
    name: str
    instructions: int
    regions: list[tuple[int, int]]   # (address, register count) of each setmaxnreg
    loops: list[Loop]


def opcode(text: str) -> str:
    """An instruction's opcode without its predicate and modifiers ('@!P0 LDG.E.64' -> LDG)."""
    return _PREDICATE.sub("", text).split(None, 1)[0].split(".", 1)[0]


def parse(sass: str, min_span: int = 40) -> list[Kernel]:
    """The kernels of cuobjdump -sass text, with their regions and loops of >= min_span."""
    heads = list(_FUNCTION.finditer(sass))
    kernels = []
    for i, h in enumerate(heads):
        body = sass[h.end():heads[i + 1].start() if i + 1 < len(heads) else len(sass)]
        rows = [(int(a, 16), t) for a, t in _INSTRUCTION.findall(body)]
        regions = [(a, int(t.rsplit("0x", 1)[1], 16)) for a, t in rows
                   if opcode(t) == _SETMAXNREG and "0x" in t]
        # ptxas puts the slow paths a branch leaves the body for (an mbarrier wait's retry)
        # after the last EXIT; their branches back are not loops
        exits = [a for a, t in rows if opcode(t) == "EXIT"]
        body_end = exits[-1] if exits else (rows[-1][0] if rows else 0)
        loops = []
        for a, t in rows:
            if a > body_end:
                break
            m = _BRANCH.search(t)
            target = int(m.group(1), 16) if m else a
            if target < a and (a - target) // INSTRUCTION_BYTES + 1 >= min_span:
                before = [n for r, n in regions if r <= target]
                loop = Loop(target, a, before[-1] if before else None)
                loop.mix.update(opcode(x) for b, x in rows if target <= b <= a)
                loops.append(loop)
        loops.sort(key=lambda lp: (lp.start, -lp.end))
        kernels.append(Kernel(h.group(1), len(rows), regions, loops))
    return kernels


def find_cuobjdump() -> str:
    env = os.environ.get("MLAGEN_CUOBJDUMP")
    if env:
        if not os.access(env, os.X_OK):
            raise Refused(f"MLAGEN_CUOBJDUMP={env}: not an executable file")
        return env
    nvcc = shutil.which("nvcc")
    for c in (shutil.which("cuobjdump"),
              nvcc and str(Path(nvcc).resolve().parent / "cuobjdump"),
              str(Path.home() / ".cache/mlagen-tools/triton/backends/nvidia/bin/cuobjdump")):
        if c and os.access(c, os.X_OK):
            return c
    raise Refused("no cuobjdump (set MLAGEN_CUOBJDUMP, put one on PATH, or run "
                  "benchmarks/sass_dump.sh once to fetch one)")


def disassemble(schedule: Path, tmp: Path, cuobjdump: str) -> str:
    try:
        sched = load(str(schedule))
    except MlagenError as e:
        raise Refused(str(e).splitlines()[0])
    if sched.target.kind != "hopper":
        raise Refused(f"{schedule}: not a Hopper schedule (target {sched.target.kind})")
    src = render(sched)
    d = tmp / schedule.stem
    d.mkdir(parents=True)
    (d / "split.cu").write_text(src.files["split.cu"])
    try:
        compile_cubin(d / "split.cu", src.include_dirs, src.flags, d / "split.cubin")
    except RuntimeError as e:
        raise Refused(f"{schedule}: split.cu does not build: "
                      f"{(str(e).strip().splitlines() or ['?'])[-1]}")
    r = subprocess.run([cuobjdump, "-sass", str(d / "split.cubin")], capture_output=True,
                       text=True)
    if r.returncode != 0:
        raise Refused(f"{cuobjdump} failed on {schedule.name}'s cubin")
    return r.stdout


def report(name: str, kernels: list[Kernel], mix: int) -> list[str]:
    out = []
    for k in kernels:
        out.append(f"{name}  {k.name}  {k.instructions} instructions")
        if k.regions:
            out.append("  registers: " + ", ".join(f"{n} from {a:#x}" for a, n in k.regions))
        for lp in k.loops:
            where = f"after setmaxnreg {lp.region}" if lp.region is not None else "no region"
            top = ", ".join(f"{op} {n}" for op, n in lp.mix.most_common(mix))
            out.append(f"  loop {lp.start:#07x}-{lp.end:#07x}  {lp.instructions} instructions "
                       f"({where}): {top}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("schedules", nargs="+", type=Path, help="Hopper schedule files")
    ap.add_argument("--kernel", default="", help="only kernels whose symbol contains this")
    ap.add_argument("--min", type=int, default=40, dest="min_span",
                    help="the shortest loop to list, in instructions (40)")
    ap.add_argument("--mix", type=int, default=8, help="opcodes listed a loop (8)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of lines")
    args = ap.parse_args(argv)
    try:
        if args.min_span < 2 or args.mix < 0:
            raise Refused("--min takes 2 or more, --mix 0 or more")
        if shutil.which("nvcc") is None:
            raise Refused("no nvcc on PATH")
        missing = [str(p) for p in args.schedules if not p.is_file()]
        if missing:
            raise Refused(f"no such schedule file: {missing[0]}")
        cuobjdump = find_cuobjdump()
        found = {}
        with tempfile.TemporaryDirectory(prefix="sass-loops-") as t:
            for s in args.schedules:
                ks = parse(disassemble(s, Path(t), cuobjdump), args.min_span)
                found[s.stem] = [k for k in ks if args.kernel in k.name]
    except Refused as e:
        print(f"sass_loops: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({s: [dict(name=k.name, instructions=k.instructions,
                                   regions=[dict(address=a, registers=n) for a, n in k.regions],
                                   loops=[dict(start=lp.start, end=lp.end,
                                               instructions=lp.instructions, region=lp.region,
                                               mix=dict(lp.mix.most_common())) for lp in k.loops])
                              for k in ks] for s, ks in found.items()}, indent=1))
    else:
        for s, ks in found.items():
            print("\n".join(report(s, ks, args.mix)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
