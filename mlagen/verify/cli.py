"""`mlagen verify`: the arguments and the command, for mlagen/cli.py to wire in.

    mlagen verify SCHEDULE [--examples N] [--profile smoke|ci|explore] [--seed S]
                           [--time-budget SECONDS] [--no-progress] [--json FILE]
    mlagen verify --repro FILE

Exit status: 0 all examples passed, 1 a failure was found, 2 the command could not run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

from ..errors import MlagenError
from .profiles import ENV, PROFILES   # light: no torch, no hypothesis (mlagen --help)


def _count(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {v}")
    return v


def _seed(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 0 <= v < 2 ** 63:
        raise argparse.ArgumentTypeError(f"must be between 0 and 2**63 - 1, got {v}")
    return v


def _seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not (math.isfinite(v) and v > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return v


def add_verify_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("schedule", nargs="?", help="schedule file (TOML) to verify")
    parser.add_argument("--examples", "-n", type=_count, default=None,
                        help="examples to draw (default: the profile's)")
    parser.add_argument("--profile", choices=sorted(PROFILES), default=None,
                        help=f"smoke (every compile-time branch of the schedule's family, "
                             f"few examples: per change), ci (derandomized, small, "
                             f"time-bounded) or explore (random, larger, remembers "
                             f"failures); default ${ENV} or ci")
    parser.add_argument("--seed", type=_seed, default=None,
                        help="draw a different (reproducible) sequence of examples")
    parser.add_argument("--time-budget", type=_seconds, default=None, metavar="SECONDS",
                        help="stop drawing new examples after this long (default: the "
                             "profile's; ci 900 s, explore none)")
    parser.add_argument("--repro", metavar="FILE", default=None,
                        help="replay a saved failing example instead of drawing new ones")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--json", metavar="FILE", default=None,
                        help="also write the result as JSON here (checked before the run)")
    return parser


def _json_target(path: str) -> Path:
    """The --json path, refused before any example runs (a long run's result is not lost
    to a typo at its end)."""
    p = Path(path).expanduser()
    if p.is_dir():
        raise MlagenError(f"{path}: --json: is a directory")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise MlagenError(f"{path}: --json: no folder {parent}")
    if not os.access(parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise MlagenError(f"{path}: --json: cannot write there")
    return p


def verify_main(args: argparse.Namespace, out=None, err=None) -> int:
    """Results go to `out` (stdout); a command that cannot run says why on `err` (stderr),
    in the main CLI's one-line form, and returns 2."""
    out = out or sys.stdout
    err = err or sys.stderr
    from ..backends import require_device

    try:
        json_path = _json_target(args.json) if getattr(args, "json", None) else None
        if args.repro:
            if args.schedule:
                print("mlagen: give a schedule or --repro FILE, not both", file=err)
                return 2
            from . import repro
            from .runner import replay

            rp = repro.load(args.repro)
            require_device(rp.schedule)     # before any worker starts or file is written
            result = replay(rp)
        else:
            if not args.schedule:
                print("mlagen: give a schedule file (or --repro FILE)", file=err)
                return 2
            from .. import load_schedule
            from .runner import verify

            schedule = load_schedule(args.schedule)
            require_device(schedule)        # no GPU: exit 2, no worker, no repro file
            result = verify(schedule, examples=args.examples, profile=args.profile,
                            seed=args.seed, progress=not args.no_progress,
                            time_budget_s=getattr(args, "time_budget", None))
    except (MlagenError, ValueError) as e:
        print(f"mlagen: {e}", file=err)
        return 2
    print(result.summary(), file=out)
    if json_path is not None:
        try:
            tmp = json_path.with_name(json_path.name + ".tmp")
            tmp.write_text(json.dumps(result.record(), indent=1) + "\n")
            tmp.replace(json_path)
        except OSError as e:
            print(f"mlagen: {json_path}: --json: {e.strerror or e}", file=err)
            return 2
    return 0 if result.ok else 1


def main(argv=None) -> int:
    """Stand-alone entry (python -m mlagen.verify.cli) until the main CLI wires it in."""
    parser = add_verify_arguments(argparse.ArgumentParser(prog="mlagen verify"))
    return verify_main(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
