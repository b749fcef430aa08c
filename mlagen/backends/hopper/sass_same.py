"""Whether a change leaves the Hopper kernels' machine code as it was, on a machine with nvcc
and no GPU.  Renders split.cu of each Hopper example schedule with two trees' mlagen (BASE: a
git revision, or a folder holding mlagen/ and templates/; and this checkout), builds each to
an sm_90a cubin with the JIT's flags less -lineinfo (line numbers move with any edit), and
compares every ELF section.  A refactor of the kernel headers that keeps every section on
every example is the same program there: what the GPU checked before still holds.

    python -m mlagen.backends.hopper.sass_same --base HEAD      # the uncommitted change
    python -m mlagen.backends.hopper.sass_same --base 983d9d4 schedules/hopper_wgmma.toml

Exit 0: the same on every schedule; 1: not (the schedules and sections that differ are
named); 2: bad input (no nvcc, an unknown revision, a schedule that does not render or build).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .codesize import compile_cubin, elf_sections

ROOT = Path(__file__).resolve().parents[3]   # the checkout this package runs from

# run in a tree's own interpreter path: its render, its headers
RENDER = """
import json, sys
from pathlib import Path
from mlagen.schedule import load
from mlagen.backends.hopper import render
out = Path(sys.argv[1])
built = {}
for f in sys.argv[2:]:
    src = render(load(f))
    d = out / Path(f).stem
    d.mkdir(parents=True, exist_ok=True)
    for name, text in src.files.items():
        (d / name).write_text(text)
    built[Path(f).stem] = dict(flags=list(src.flags), include=list(src.include_dirs))
print(json.dumps(built))
"""


class Refused(Exception):
    """Bad input: one line, exit 2."""


def differing(a: bytes, b: bytes) -> list[str]:
    sa, sb = elf_sections(a), elf_sections(b)
    return sorted(k for k in set(sa) | set(sb) if sa.get(k) != sb.get(k))


def base_tree(base: str, tmp: Path) -> Path:
    """A folder with mlagen/ and templates/ as at BASE."""
    p = Path(base)
    if p.is_dir():
        if not ((p / "mlagen").is_dir() and (p / "templates").is_dir()):
            raise Refused(f"--base {base}: a folder without mlagen/ and templates/")
        return p
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", "-q",
                          f"{base}^{{commit}}"], capture_output=True, text=True)
    if rev.returncode != 0:
        raise Refused(f"--base {base}: neither a folder nor a revision of this checkout")
    arc = tmp / "base.tar"
    subprocess.run(["git", "-C", str(ROOT), "archive", "-o", str(arc), rev.stdout.strip(),
                    "mlagen", "templates", "targets"], check=True)
    with tarfile.open(arc) as t:
        t.extractall(tmp / "base", filter="data")
    return tmp / "base"


def render_in(tree: Path, schedules: list[Path], out: Path) -> dict:
    proc = subprocess.run([sys.executable, "-c", RENDER, str(out), *map(str, schedules)],
                          capture_output=True, text=True, cwd=tree,
                          env={"PYTHONPATH": str(tree), "PATH": os.environ.get("PATH", "")})
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise Refused(f"{tree}: the schedules do not render there: {last}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def build(d: Path, spec: dict) -> bytes:
    try:
        return compile_cubin(d / "split.cu", spec["include"], spec["flags"], d / "split.cubin")
    except RuntimeError as e:
        raise Refused(f"{d.name}: split.cu does not build: {str(e).strip().splitlines()[-1]}")


def compare(base: str, schedules: list[Path], jobs: int) -> dict[str, list[str]]:
    """schedule stem -> the cubin sections that differ between BASE and this checkout."""
    with tempfile.TemporaryDirectory(prefix="sass-same-") as t:
        tmp = Path(t)
        trees = {"base": base_tree(base, tmp), "tree": ROOT}
        specs = {k: render_in(v, schedules, tmp / k) for k, v in trees.items()}
        todo = [(k, s) for k in specs for s in specs[k]]
        with ThreadPoolExecutor(jobs) as ex:
            bins = dict(zip(todo, ex.map(lambda ks: build(tmp / ks[0] / ks[1],
                                                          specs[ks[0]][ks[1]]), todo)))
        return {s: differing(bins[("base", s)], bins[("tree", s)]) for s in specs["tree"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="HEAD", help="a revision or a tree folder (HEAD)")
    ap.add_argument("--jobs", type=int, default=2, help="builds at once (2)")
    ap.add_argument("schedules", nargs="*", type=Path,
                    help="Hopper schedule files (default: the example schedules)")
    args = ap.parse_args(argv)
    schedules = [p.resolve() for p in args.schedules] or \
        sorted((ROOT / "schedules").glob("hopper_*.toml"))
    try:
        if shutil.which("nvcc") is None:
            raise Refused("no nvcc on PATH")
        missing = [str(p) for p in schedules if not p.is_file()]
        if missing:
            raise Refused(f"no such schedule file: {missing[0]}")
        result = compare(args.base, schedules, max(1, args.jobs))
    except Refused as e:
        print(f"sass_same: {e}", file=sys.stderr)
        return 2
    for name, diff in result.items():
        print(f"{name}: " + ("same" if not diff else "DIFFERS in " + ", ".join(diff)))
    return 0 if not any(result.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
