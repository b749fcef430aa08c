"""`mlagen verify`: the arguments and the command, for mlagen/cli.py to wire in.

    mlagen verify SCHEDULE [--examples N] [--profile ci|explore] [--seed S]
                           [--time-budget SECONDS] [--no-progress]
    mlagen verify --repro FILE

Exit status: 0 all examples passed, 1 a failure was found, 2 the command could not run.
"""

from __future__ import annotations

import argparse
import sys

from ..errors import MlagenError
from .profiles import ENV, PROFILES


def add_verify_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("schedule", nargs="?", help="schedule file (TOML) to verify")
    parser.add_argument("--examples", "-n", type=int, default=None,
                        help="examples to draw (default: the profile's)")
    parser.add_argument("--profile", choices=sorted(PROFILES), default=None,
                        help=f"ci (derandomized, small, time-bounded) or explore (random, "
                             f"larger, remembers failures); default ${ENV} or ci")
    parser.add_argument("--seed", type=int, default=None,
                        help="draw a different (reproducible) sequence of examples")
    parser.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                        help="stop drawing new examples after this long (default: the "
                             "profile's; ci 900 s, explore none)")
    parser.add_argument("--repro", metavar="FILE", default=None,
                        help="replay a saved failing example instead of drawing new ones")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def verify_main(args: argparse.Namespace, out=None, err=None) -> int:
    """Results go to `out` (stdout); a command that cannot run says why on `err` (stderr),
    in the main CLI's one-line form, and returns 2."""
    out = out or sys.stdout
    err = err or sys.stderr
    from .runner import replay, verify

    try:
        if args.repro:
            if args.schedule:
                print("mlagen: give a schedule or --repro FILE, not both", file=err)
                return 2
            result = replay(args.repro)
        else:
            if not args.schedule:
                print("mlagen: give a schedule file (or --repro FILE)", file=err)
                return 2
            from .. import load_schedule

            schedule = load_schedule(args.schedule)
            result = verify(schedule, examples=args.examples, profile=args.profile,
                            seed=args.seed, progress=not args.no_progress,
                            time_budget_s=getattr(args, "time_budget", None))
    except (MlagenError, ValueError) as e:
        print(f"mlagen: {e}", file=err)
        return 2
    print(result.summary(), file=out)
    return 0 if result.ok else 1


def main(argv=None) -> int:
    """Stand-alone entry (python -m mlagen.verify.cli) until the main CLI wires it in."""
    parser = add_verify_arguments(argparse.ArgumentParser(prog="mlagen verify"))
    return verify_main(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
