"""Command line: argument parsing only; every command calls the public API.

    mlagen check SCHEDULE            validate against the target, print the resources it needs
    mlagen generate SCHEDULE -o DIR  render kernel sources (--examples: regenerate generated/)
    mlagen build SCHEDULE            compile (cached) and print the artifact
    mlagen run SCHEDULE              build, run on random data, check against the reference
    mlagen verify SCHEDULE           hypothesis-driven verification against the reference
    mlagen bench --target KIND       a target's benchmark
    mlagen cache list | clear        the build cache
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from . import __version__
from .errors import MlagenError


def _schedule(path: str):
    from .schedule import load

    return load(path)


# ---------------------------------------------------------------- commands ---------
def cmd_check(args) -> int:
    from .schedule import plan_of

    for path in args.schedules:
        plan = plan_of(_schedule(path))
        print(f"{path}: ok ({plan.variant})")
        if args.verbose:
            print(plan.resources.table())
    return 0


def cmd_generate(args) -> int:
    from .examples import EXAMPLES_OUT, regenerate

    if args.examples:
        written = regenerate(Path(args.output or EXAMPLES_OUT))
        print(f"regenerated {len(written)} files under {args.output or EXAMPLES_OUT}")
        return 0
    if not args.schedules:
        raise MlagenError("give a schedule file, or --examples to regenerate generated/")
    from . import generate

    out = Path(args.output or ".")
    for path in args.schedules:
        s = _schedule(path)
        for p in generate(s, out / s.name):
            print(p)
    return 0


def cmd_build(args) -> int:
    from . import build

    for path in args.schedules:
        s = _schedule(path)
        t0 = time.perf_counter()
        a = build(s, progress=True)
        how = "built" if a.built else "cached"
        print(f"{s.name}: {how} in {time.perf_counter() - t0:.2f} s -> {a.path}")
    return 0


def cmd_run(args) -> int:
    from .report import run_report

    s = _schedule(args.schedule)
    return run_report(s, batch=args.batch, seqlen=args.seqlen, s_q=args.s_q, seed=args.seed,
                      scheme=args.scheme, chart=args.chart, varlen=args.varlen)


def cmd_verify(args) -> int:
    from .verify.cli import verify_main

    return verify_main(args)


def cmd_bench(args) -> int:
    from .backends import backend

    return backend(args.target).bench_main(args)


def cmd_cache(args) -> int:
    from .jit import clear, entries
    from .paths import cache_dir

    if args.action == "list":
        es = entries()
        print(f"cache: {cache_dir()} ({len(es)} builds)")
        for e in es:
            print(f"  {e.key:<72} {e.size / 1e6:7.2f} MB  "
                  f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(e.created))}")
    elif args.action == "clear":
        n = clear()
        print(f"removed {n} builds from {cache_dir()}")
    else:  # "dir"
        print(cache_dir())
    return 0


# ---------------------------------------------------------------- parser -----------
def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="mlagen",
        description="Generate, build, run and verify MLA decode kernels from schedule files.")
    ap.add_argument("--version", action="version", version=f"mlagen {__version__}")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("check", help="validate schedules against their targets")
    p.add_argument("schedules", nargs="+", metavar="SCHEDULE")
    p.add_argument("-v", "--verbose", action="store_true", help="print the resource table")
    p.set_defaults(fn=cmd_check)

    p = sub.add_parser("generate", help="render kernel sources of schedules")
    p.add_argument("schedules", nargs="*", metavar="SCHEDULE")
    p.add_argument("-o", "--output", help="output folder (default: . ; with --examples: "
                   "generated/)")
    p.add_argument("--examples", action="store_true",
                   help="regenerate the sources of every example schedule in schedules/")
    p.set_defaults(fn=cmd_generate)

    p = sub.add_parser("build", help="compile schedules' kernels into the cache")
    p.add_argument("schedules", nargs="+", metavar="SCHEDULE")
    p.set_defaults(fn=cmd_build)

    p = sub.add_parser("run", help="build, run on random data, compare with the reference "
                       "(and the target's report, e.g. a simulated timeline)")
    p.add_argument("schedule", metavar="SCHEDULE")
    p.add_argument("--batch", type=int, default=None, help="sequences (default: per target)")
    p.add_argument("--seqlen", type=int, default=None, help="KV length of each sequence")
    p.add_argument("--s-q", type=int, default=1, help="query tokens per sequence")
    p.add_argument("--varlen", action="store_true", help="draw lengths around --seqlen")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scheme", default=None,
                   help="run-time multi-core scheme, where the target has one "
                        "(default: the schedule's)")
    p.add_argument("--chart", default=None,
                   help="timeline chart path prefix, where the target draws one "
                        "(default: out/<schedule>)")
    p.set_defaults(fn=cmd_run)

    p = sub.add_parser("verify", help="check a schedule's kernel against the reference over "
                       "hypothesis-drawn problems")
    try:
        from .verify.cli import add_verify_arguments
        add_verify_arguments(p)
    except ImportError:  # pragma: no cover - verify not installed
        p.add_argument("schedule")
    p.set_defaults(fn=cmd_verify)

    from .backends import default_kind, kinds

    p = sub.add_parser("bench", help="a target's benchmark (--target KIND)")
    p.add_argument("--target", choices=kinds(), default=default_kind())
    p.add_argument("--schedule", default=None, help="schedule file (default: the example)")
    p.add_argument("--output", default=None, help="write the table (markdown) here")
    p.add_argument("--quick", action="store_true", help="a reduced grid")
    p.set_defaults(fn=cmd_bench)

    p = sub.add_parser("cache", help="list or clear the build cache")
    p.add_argument("action", choices=("list", "clear", "dir"))
    p.set_defaults(fn=cmd_cache)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return int(args.fn(args) or 0)
    except MlagenError as e:
        print(f"mlagen: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("mlagen: interrupted", file=sys.stderr)
        return 130
    except OSError as e:     # missing files, unwritable output folders
        print(f"mlagen: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
