"""Command line: argument parsing only; every command calls the public API.

    mlagen check SCHEDULE            validate against the target, print the resources it needs
    mlagen generate SCHEDULE -o DIR  render kernel sources (--examples: regenerate generated/)
    mlagen build SCHEDULE            compile (cached) and print the artifact
    mlagen run SCHEDULE              build, run on random data, check against the reference
    mlagen verify SCHEDULE           hypothesis-driven verification against the reference
    mlagen bench --target KIND       a target's benchmark
    mlagen tune --target KIND        a target's measured search of per-shape defaults
    mlagen cache list | clear        the build cache
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

from .errors import MlagenError, clip
from .version import __version__

INT64_MAX = 2 ** 63 - 1


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and exit status 2), like every other."""

    def error(self, message: str):
        # a value argparse quotes whole ("invalid choice: '...'"): ~80 characters of it
        message = re.sub(r"'([^']{80,})'", lambda m: clip(repr(m.group(1))), message)
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _int(lo: int, hi: int = INT64_MAX):
    """An argparse type: a whole number in [lo, hi]."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{clip(repr(text))} is not a whole number") from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"must be at least {lo}, got {v}")
        if v > hi:
            raise argparse.ArgumentTypeError(f"must be at most {hi}, got {v}")
        return v
    parse.__name__ = "int"
    return parse


def _schedule(path: str):
    """Load a schedule file, or a shipped example by name (mlagen.paths.schedule_path: the
    rule every command and mlagen.load_schedule follow)."""
    from .schedule import load

    return load(path)


def _schedules(paths: list[str]) -> list:
    """Load (and check) every schedule before any output is written."""
    return [(p, _schedule(p)) for p in paths]


# ---------------------------------------------------------------- commands ---------
def cmd_check(args) -> int:
    from .schedule import plan_of

    for path, s in _schedules(args.schedules):
        plan = plan_of(s)
        print(f"{path}: ok ({plan.variant})")
        if args.verbose:
            _resource_table(plan.resources)
    return 0


def _resource_table(report) -> None:
    from .console import human_bytes, table

    def size(name: str, v: int) -> str:
        return human_bytes(v) if "bytes" in name else str(v)

    rows = [(n.name.replace(" bytes", ""), size(n.name, n.needed), size(n.name, n.available),
             f"{n.needed / max(n.available, 1):.0%}", "ok" if n.ok else "TOO MUCH", n.detail)
            for n in report.needs]
    table(("resource", "needed", "available", "use", "fits", "counted as"), rows,
          right=(1, 2, 3))


def cmd_generate(args) -> int:
    from .examples import EXAMPLES_OUT, regenerate

    if args.examples:
        _output_folder(args.output or EXAMPLES_OUT, "-o")
        written = regenerate(Path(args.output or EXAMPLES_OUT))
        print(f"regenerated {len(written)} files under {args.output or EXAMPLES_OUT}")
        return 0
    if not args.schedules:
        raise MlagenError("give a schedule file, or --examples to regenerate generated/")
    from . import generate, render
    from .codegen import compile_command

    out = Path(args.output or ".")
    _output_folder(out, "-o")
    loaded = _schedules(args.schedules)
    folders: dict[str, tuple[str, Path]] = {}
    for path, s in loaded:            # each schedule writes into out/<its name>/
        first, source = folders.setdefault(s.name, (path, Path(s.source or path).resolve()))
        if source != Path(s.source or path).resolve():
            raise MlagenError(f"{_shown(first)} and {_shown(path)} would both be written "
                              f"into {_shown(out / s.name)}; generate them into separate "
                              "folders (-o)")
    done = set()
    for path, s in loaded:
        if s.name in done:            # the same file named twice: written once
            continue
        done.add(s.name)
        files = generate(s, out / s.name)
        headers = [p for p in files if p.is_relative_to(out / s.name / "include")]
        for p in files:
            if p not in headers:
                print(p)
        sources = render(s)
        print(f"{out / s.name / 'include'}/: {len(headers)} headers they include "
              f"(copied from {', '.join(sources.include_dirs)})")
        print(f"  to compile by hand: cd {out / s.name} && {compile_command(sources)}")
    return 0


def cmd_build(args) -> int:
    from . import build, console
    from .schedule import plan_of

    backends = []
    for _, s in _schedules(args.schedules):
        t0 = time.perf_counter()
        a = build(s)
        how = "built" if a.built else "cached"
        print(f"{s.name}: {how} in {time.perf_counter() - t0:.2f} s -> {a.path}")
        b = plan_of(s).backend
        if b not in backends:
            backends.append(b)
    for b in backends:             # what each target's runtime builds on first use
        line = b.prebuild(console.PROGRESS)
        if line:
            print(line)
    return 0


def cmd_run(args) -> int:
    from .report import run_report

    if args.chart is not None:        # a path prefix: the charts go beside it
        _writable_under(Path(args.chart), "--chart")
    s = _schedule(args.schedule)
    if args.tp is not None:
        from .tprun import run_tp

        return run_tp(s, args.tp, batch=args.batch, seqlen=args.seqlen, s_q=args.s_q,
                      seed=args.seed, scheme=args.scheme, varlen=args.varlen)
    return run_report(s, batch=args.batch, seqlen=args.seqlen, s_q=args.s_q, seed=args.seed,
                      scheme=args.scheme, chart=args.chart, varlen=args.varlen)


def cmd_verify(args) -> int:
    from .verify.cli import verify_main

    return verify_main(args)


def _writable_under(p: Path, flag: str) -> None:
    """The folders that would be made above ``p`` can be: the nearest existing one is a
    folder that a file can be created in (tried, not guessed from permission bits: root
    passes those, a read-only mount does not)."""
    import tempfile

    parent = p.parent
    while not parent.exists() and parent != parent.parent:   # the folders that would be made
        parent = parent.parent
    if not parent.is_dir():
        raise MlagenError(f"{_shown(p)}: {flag}: {_shown(parent)} is not a folder")
    try:
        fd, probe = tempfile.mkstemp(dir=parent, prefix=".mlagen-probe-")
    except OSError as e:
        raise MlagenError(f"{_shown(p)}: {flag}: cannot write in {_shown(parent)} "
                          f"({e.strerror or e})") from None
    os.close(fd)
    os.unlink(probe)


def _shown(p) -> str:
    return clip(str(p))


def _output_file(path: str | None, flag: str) -> None:
    """Refuse an output path that cannot be written before the work starts."""
    if path is None:
        return
    p = Path(path)
    if p.is_dir():
        raise MlagenError(f"{_shown(p)}: {flag} must be a file, not a folder")
    _writable_under(p, flag)


def _output_folder(path: str | Path, flag: str) -> None:
    """Refuse an output folder that cannot be made or written before the work starts."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise MlagenError(f"{_shown(p)}: {flag} must be a folder, not a file")
    _writable_under(p / "x", flag)


def cmd_bench(args) -> int:
    _output_file(args.output, "--output")
    from .backends import backend

    return backend(args.target).bench_main(args)


def cmd_tune(args) -> int:
    _output_file(args.table, "--table")
    from .backends import backend

    return backend(args.target).tune_main(args)


def cmd_cache(args) -> int:
    from .jit import clear, entries
    from .paths import cache_dir

    if args.action == "list":
        es = entries()
        print(f"cache: {cache_dir()} ({len(es)} builds)")
        if es:
            from .console import human_bytes, table

            table(("build", "size", "created", "state"),
                  [(e.key, human_bytes(e.size),
                    time.strftime("%Y-%m-%d %H:%M", time.localtime(e.created)),
                    "ok" if e.damaged is None else f"damaged: {e.damaged}") for e in es],
                  right=(1,), whole=(0,))
            bad = sum(e.damaged is not None for e in es)
            if bad:
                print(f"{bad} damaged builds: the next build of each replaces it "
                      "(or `mlagen cache clear`)")
    elif args.action == "clear":
        n = clear()
        print(f"removed {n} builds from {cache_dir()}")
    else:  # "dir"
        print(cache_dir())
    return 0


# ---------------------------------------------------------------- parser -----------
def parser() -> argparse.ArgumentParser:
    ap = _Parser(
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
    p.add_argument("--batch", type=_int(1), default=None,
                   help="sequences (default: per target)")
    p.add_argument("--seqlen", type=_int(1), default=None, help="KV length of each sequence")
    p.add_argument("--s-q", type=_int(1), default=1, help="query tokens per sequence")
    p.add_argument("--varlen", action="store_true", help="draw lengths around --seqlen")
    p.add_argument("--seed", type=_int(0), default=0)
    p.add_argument("--scheme", default=None,
                   help="run-time multi-core scheme, where the target has one "
                        "(default: the schedule's)")
    p.add_argument("--chart", default=None,
                   help="timeline chart path prefix, where the target draws one "
                        "(default: out/<schedule>)")
    p.add_argument("--tp", type=int, default=None,
                   help="a real tensor-parallel run: N processes (gloo / nccl), heads split "
                        "by rank; replaces the schedule's tp")
    p.set_defaults(fn=cmd_run)

    p = sub.add_parser("verify", help="check a schedule's kernel against the reference over "
                       "hypothesis-drawn problems")
    from .verify.cli import add_verify_arguments   # light: no torch, no hypothesis

    add_verify_arguments(p)
    p.set_defaults(fn=cmd_verify)

    from .backends import default_kind, kinds

    p = sub.add_parser("bench", help="a target's benchmark (--target KIND)")
    p.add_argument("--target", choices=kinds(), default=default_kind())
    p.add_argument("--schedule", default=None, help="schedule file (default: the example)")
    p.add_argument("--output", default=None, help="write the table (markdown) here")
    p.add_argument("--quick", action="store_true", help="a reduced grid")
    p.add_argument("--no-progress", action="store_true", help="print rows instead of a bar")
    p.add_argument("--kv-format", default=None, metavar="FORMAT[,FORMAT...]",
                   help="KV-cache formats to compare, comma-separated (targets whose bench "
                        "takes them; the default is the target's)")
    p.add_argument("--shape", action="append", metavar="B,S_Q,S_K,H_Q[,varlen]",
                   help="time this shape instead of the benchmark of record's rows "
                        "(repeatable; targets whose bench has rows of shapes)")
    p.add_argument("--flashmla", default=None, metavar="LIB",
                   help="also time FlashMLA (built as benchmarks/anchors/README.md says) on each "
                   "row's tensors (the 'now' columns; targets with a FlashMLA reference)")
    p.add_argument("--vllm-fp8", default=None, metavar="LIB",
                   help="also time vLLM's dense FP8 FlashMLA kernel (its torch extension, "
                        "benchmarks/anchors/README.md) on the fp8_e4m3 rows' caches")
    p.add_argument("--fp8-mma", default=None, choices=("dequant", "mma"),
                   help="the fp8_e4m3 rows' fp8_mma knob (targets whose bench takes it: \"mma\" "
                        "times e4m3 MMAs where the kernel has them)")
    p.set_defaults(fn=cmd_bench)

    p = sub.add_parser("tune", help="measure a target's legal schedules on a list of shapes and "
                       "write the table its per-shape defaults read")
    p.add_argument("--target", choices=kinds(), required=True)
    p.add_argument("--shape", action="append", metavar="B,S_Q,S_K,H_Q[,varlen]",
                   help="a shape to tune (repeatable; default: the target's benchmark rows)")
    p.add_argument("--space", choices=("defaults", "small", "wgmma", "full"), default="small",
                   help="search space (defaults: the static per-class tiles only; small: tile "
                        "shapes around them; wgmma: the wgmma kernels alone, split costs 2-12; full: "
                        "every legal tile and split cost)")
    p.add_argument("--table", default=None, help="table file (default: "
                   "$MLAGEN_HOPPER_TUNE_TABLE or the cache's hopper_tune.json); resumes from "
                   "its .log.jsonl")
    p.add_argument("--quick", action="store_true", help="the first 4 shapes only")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(fn=cmd_tune)

    p = sub.add_parser("cache", help="list or clear the build cache")
    p.add_argument("action", choices=("list", "clear", "dir"))
    p.set_defaults(fn=cmd_cache)
    return ap


def _os_error(e: OSError) -> str:
    where = f": {clip(str(e.filename))}" if e.filename else ""
    return f"{e.strerror or clip(str(e))}{where}"


def _one_line_each(text: str, limit: int = 400) -> str:
    """An error's lines, none longer than ``limit``: what a value echoed whole would make
    (each site clips its values to ~80 characters; this catches one that does not)."""
    return "\n".join(clip(line, limit) for line in str(text).splitlines())


def main(argv: list[str] | None = None) -> int:
    """The ``mlagen`` command.  Exit status: 0 done, 1 a check failed (outputs differ from
    the reference, verify found a failure), 2 the command could not run (bad input, a
    missing device, a build error): one line on stderr saying why, never a traceback."""
    args = parser().parse_args(argv)
    from . import console

    was, console.PROGRESS = console.PROGRESS, True    # say what every wait is for
    try:
        from .environment import check_all

        check_all()                 # every variable mlagen reads, before any work
        rc = int(args.fn(args) or 0)
        sys.stdout.flush()          # a closed pipe shows here, not at interpreter exit
        return rc
    except BrokenPipeError:
        # `mlagen ... | head`: the reader left; say nothing, as other tools do
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except MlagenError as e:
        print(f"mlagen: {_one_line_each(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("mlagen: interrupted", file=sys.stderr)
        return 130
    except OSError as e:     # missing files, unwritable output folders
        print(f"mlagen: {_os_error(e)}", file=sys.stderr)
        return 2
    except MemoryError:
        print("mlagen: out of memory (try a smaller --batch or --seqlen)", file=sys.stderr)
        return 2
    finally:
        console.PROGRESS = was


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
