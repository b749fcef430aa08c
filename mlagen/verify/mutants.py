"""The verifier's power, measured: realistic one-line faults planted in the kernel sources,
each of which `verify` must catch on the shipped example schedules.

    python -m mlagen.verify.mutants --target KIND [--profile smoke] [--out FILE.json]
    python -m mlagen.verify.mutants --target KIND --compile-only   (compile, no device)
    python -m mlagen.verify.mutants --list

The mutants of a target are its backend's ``mutants()`` (mlagen/backends/<kind>/mutants.py,
records of mutation.py).

A mutant is a textual patch (mlagen.jit.patches) of one line of a template or header: the
slips a kernel engineer makes (a sum not rescaled when the max moves, `<` for `<=`, the
wrong warpgroup's state kept, an offset inside a page dropped).  They are distinct from
the `kFault` / FAULT_* codes the kernels carry for the verifier's own tests (those are
compiled-in switches; these are edits of a copy, which the real kernel never contains)
and from each other.  Each must apply exactly once and compile cleanly; the harness
builds the patched copy through the ordinary build (MLAGEN_SOURCE_PATCHES names the
patch), then runs the real `verify` on each example schedule named.  A mutant is caught
by a check (a profile on a schedule) when verify fails there; the report gives the catch
rate per check and how each was caught.  Exit status: 0 every mutant caught by every
check that ran it (or, --compile-only, every mutant compiles), 1 otherwise, 2 bad usage.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Iterator, Optional, Sequence

from ..jit import patches as jit_patches
from .mutation import Mutant, planted


def all_mutants() -> tuple[Mutant, ...]:
    from ..backends import all_backends

    return tuple(m for b in all_backends() for m in b.mutants())


def mutants_for(target: str) -> tuple[Mutant, ...]:
    from ..backends import backend

    return tuple(backend(target).mutants())


def load_example(name: str):
    from ..paths import SCHEDULES_DIR
    from ..schedule import load

    return load(SCHEDULES_DIR / f"{name}.toml")


def render_patched(mutant: Mutant, schedule):
    """The mutant's patched sources for a schedule (raises PatchError if it does not
    apply exactly once)."""
    from ..codegen import render

    src = render(schedule)
    out = jit_patches.apply(src, [mutant.patch()])
    if out is src:
        raise jit_patches.PatchError(f"mutant {mutant.name}: {mutant.file} is not among the "
                                     f"sources of {schedule.name}")
    return out


def compile_check(mutant: Mutant, schedule) -> Optional[str]:
    """None when the mutant applies and compiles for `schedule` (objects only), else why."""
    from ..errors import MlagenError
    from ..jit import compile_only

    try:
        compile_only(render_patched(mutant, schedule))
    except MlagenError as e:
        return str(e).splitlines()[0]
    return None


@dataclass
class Outcome:
    mutant: str
    schedule: str
    profile: str
    caught: bool
    how: str = ""               # failure kind and what failed first
    examples_run: int = 0
    seconds: float = 0.0
    error: str = ""             # the harness could not run it (a build failure)
    budget_spent: bool = False  # verify stopped drawing at its time budget (not caught:
                                # the drawn examples it did not reach might have)


# The baseline run's name: verify on the schedule with nothing planted.  A check that fails
# unmutated (a crash at example 0, say) would "catch" every mutant run under it: those
# outcomes are not counted (Report.baselines, run's baseline).
UNMUTATED = "unmutated"


@dataclass(frozen=True)
class _Unmutated:
    target: str
    name: str = UNMUTATED


@dataclass
class Report:
    target: str
    outcomes: list[Outcome] = field(default_factory=list)
    compile_failures: dict[str, str] = field(default_factory=dict)
    baselines: list[Outcome] = field(default_factory=list)   # caught = the check failed

    def per_check(self) -> dict[str, tuple[int, int]]:
        """check (profile on schedule) -> (caught, run)."""
        out: dict[str, list[int]] = {}
        for o in self.outcomes:
            if o.error:
                continue
            c = out.setdefault(f"verify --profile {o.profile} {o.schedule}", [0, 0])
            c[0] += o.caught
            c[1] += 1
        return {k: (v[0], v[1]) for k, v in out.items()}

    def per_mutant(self) -> dict[str, bool]:
        out: dict[str, bool] = {}
        for o in self.outcomes:
            if not o.error:
                out[o.mutant] = out.get(o.mutant, False) or o.caught
        return out

    def ok(self) -> bool:
        return (not self.compile_failures and bool(self.outcomes)
                and all(o.caught and not o.error for o in self.outcomes))

    def to_json(self) -> dict:
        return {"target": self.target, "sources": sources_digest(self.target),
                "per_check": {k: {"caught": c, "run": n}
                              for k, (c, n) in self.per_check().items()},
                "per_mutant": self.per_mutant(), "compile_failures": self.compile_failures,
                "baselines": [asdict(o) for o in self.baselines],
                "outcomes": [asdict(o) for o in self.outcomes]}

    def summary(self) -> str:
        lines = [f"mutants, target {self.target}:"]
        for b in self.baselines:
            state = "FAILS unmutated" if b.caught else b.error or "passes unmutated"
            lines.append(f"  baseline verify --profile {b.profile} {b.schedule}: {state}"
                         + (f" ({b.how})" if b.caught and b.how else ""))
        for k, (c, n) in self.per_check().items():
            lines.append(f"  {k}: {c}/{n} caught")
        for name, why in self.compile_failures.items():
            lines.append(f"  {name}: does not compile: {why}")
        escaped = [o for o in self.outcomes if not o.caught]
        for o in escaped:
            lines.append(f"  {'NOT RUN' if o.error else 'ESCAPED'} {o.mutant} on {o.schedule} "
                         f"({o.profile})"
                         + (f": {o.error}" if o.error else "")
                         + (" (stopped at the time budget)" if o.budget_spent else ""))
        caught = sum(self.per_mutant().values())
        lines.append(f"  {caught}/{len(self.per_mutant())} mutants caught by some check")
        return "\n".join(lines)


def sources_digest(target: str) -> str:
    """What a report's outcomes depend on: the target's templates and headers, its backend
    (mutants, oracle allowances) and the verifier.  A report is resumed only on the same."""
    from ..paths import PACKAGE_DIR, TEMPLATES_DIR

    h = hashlib.sha256()
    for root in (TEMPLATES_DIR / target, PACKAGE_DIR / "backends" / target,
                 PACKAGE_DIR / "verify"):
        for f in sorted(root.rglob("*")):
            if f.is_file() and f.suffix != ".pyc":
                h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def load_report(path: str, target: str) -> Report:
    """A report written by --out, for --resume: its outcomes that ran and its passing
    baselines.  ValueError (one line) if it cannot be read, is another target's or was
    measured on other sources (its catches would not be this tree's)."""
    try:
        d = json.loads(Path(path).read_text())
        outcomes = [Outcome(**o) for o in d["outcomes"]]
        baselines = [Outcome(**o) for o in d.get("baselines", [])]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: not a mutants report ({type(e).__name__}: {e})") from None
    if d.get("target") != target:
        raise ValueError(f"{path}: a report of target {d.get('target')!r}, not {target!r}")
    if d.get("sources") != sources_digest(target):
        raise ValueError(f"{path}: measured on other kernel or verifier sources than this "
                         f"tree's; run those mutants again")
    return Report(target, outcomes, {}, baselines)


def _how(result) -> str:
    f = result.failure
    if f is None:
        return ""
    first = f.message.splitlines()[0] if f.message else ""
    return f"{f.kind}: {first[:160]}"


def run_one(mutant: Mutant, schedule_name: str, profile: str, examples: Optional[int] = None,
            time_budget_s: Optional[float] = None, shrink_budget_s: float = 5.0) -> Outcome:
    """Plant the mutant, run the real verify on the example schedule, say if it failed."""
    from ..errors import MlagenError
    from .runner import verify

    s = load_example(schedule_name)
    t0 = time.perf_counter()
    with planted(mutant) if mutant.name != UNMUTATED else contextlib.nullcontext():
        try:
            # a failing baseline is the oracle's or the kernel's own fault: its repro file
            # (inputs and the kernel's outputs) is kept for study; a mutant's catch is not
            r = verify(s, examples=examples, profile=profile, progress=False,
                       time_budget_s=time_budget_s, shrink_budget_s=shrink_budget_s,
                       save_failures=mutant.name == UNMUTATED)
        except MlagenError as e:       # a build failure: the mutant's, not a catch
            return Outcome(mutant.name, schedule_name, profile, False,
                           error=str(e).splitlines()[0], seconds=time.perf_counter() - t0)
    if r.failure is not None and "BuildError" in r.failure.message:
        # a family member that does not build: the mutant's fault, not a catch
        return Outcome(mutant.name, schedule_name, profile, False, _how(r), r.examples_run,
                       time.perf_counter() - t0, error="a build of the family failed")
    return Outcome(mutant.name, schedule_name, profile, not r.ok, _how(r), r.examples_run,
                   time.perf_counter() - t0, budget_spent=r.budget_spent)


def prebuild(pairs: Sequence[tuple[Mutant, object]], jobs: int, families: bool = False
             ) -> dict[str, str]:
    """Build every (mutant, schedule) pair's patched library in parallel (the verify runs
    then find them cached); with families, every member of the schedule's family too (what
    smoke runs).  Returns mutant name -> build error for those whose schedule fails (a
    member's failure is left to its verify run, which reports it)."""
    from concurrent.futures import ThreadPoolExecutor

    from ..errors import MlagenError
    from ..jit import build
    from .strategies import family

    todo = []
    for m, s in pairs:
        todo.append((m, s, True))
        if families:
            todo += [(m, f, False) for f in family(s)[1:]]

    def one(item):
        m, s, own = item
        try:
            build(render_patched(m, s), progress=False)
        except MlagenError as e:
            return m.name, str(e).splitlines()[0] if own else None
        return m.name, None

    errors = {}
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for name, err in pool.map(one, todo):
            if err:
                errors[name] = err
    return errors


def run(target: str, profiles: Sequence[str] = ("smoke",), only: Sequence[str] = (),
        schedules: Sequence[str] = (), examples: Optional[int] = None,
        time_budget_s: Optional[float] = None, jobs: int = 0, log=None,
        prebuild_all: Optional[bool] = None, first_schedule: bool = False,
        parallel: int = 1, isolate: bool = True, wall_limit_s: Optional[float] = None,
        baseline: bool = True, shard: Optional[tuple[int, int]] = None,
        resume: Sequence[Report] = ()) -> Report:
    """Every mutant of `target` (or those named in `only`) against verify on its example
    schedules (or `schedules`; with first_schedule, each mutant's first only), under each
    profile.  prebuild_all: build every run's schedule in parallel first (default: on GPU
    targets, whose builds are slow and whose hosts have cores to spare; on the CPU verify
    builds what it reaches, lazily).  isolate: each verify run in a process of its own,
    `parallel` at once (a mutant that makes an in-process kernel crash -- an emulator
    reading past its cache -- kills that run's process only, and counts as caught by a
    crash, as it is when a user runs verify on it).  wall_limit_s: past it (from the start,
    builds included) no run starts and the running ones are stopped; each is reported
    not reached (an error, neither caught nor escaped), so the report is written in time.
    baseline: first verify each (schedule, profile) with nothing planted; a mutant outcome
    under a check that fails so is not counted (only = [UNMUTATED]: the baselines of
    `schedules` alone, as outcomes).  shard (k, n): only the runs on the k-th of n groups of
    the planned schedules (schedule i of the sorted names is in group i % n), so that n
    device calls together run the whole list, each with its own schedules' baselines.
    resume: earlier reports of the same sources (load_report); their runs that finished
    and their passing baselines are carried into this report, not run again, so calls
    cut short by a wall limit add up to the whole list."""
    t_start = time.perf_counter()
    from ..backends import backend

    report = Report(target)
    if list(only) == [UNMUTATED]:
        chosen, plan = [], [(_Unmutated(target), n) for n in schedules]
        baseline = False
    else:
        chosen = [m for m in mutants_for(target) if not only or m.name in only]
        plan = []
    for m in chosen:
        names = list(schedules) or list(m.schedules)
        plan += [(m, n) for n in (names[:1] if first_schedule else names)]
    if shard is not None:
        k, n_shards = shard
        names = sorted({n for _, n in plan})
        mine = {n for i, n in enumerate(names) if i % n_shards == k}
        plan = [(m, n) for m, n in plan if n in mine]
    done = {(o.mutant, o.schedule, o.profile): o for r in resume for o in r.outcomes
            if not o.error}
    passed = {(b.schedule, b.profile): b for r in resume for b in r.baselines
              if not b.caught and not b.error}
    plan = [(m, n) for m, n in plan
            if any((m.name, n, prof) not in done for prof in profiles)]
    jobs = jobs or max(1, (os.cpu_count() or 2) // 2)
    if prebuild_all is None:
        prebuild_all = backend(target).device != "cpu"
    if prebuild_all:
        # the schedule itself; its family's other members build when verify reaches them
        from .profiles import PROFILES

        report.compile_failures = prebuild([(m, load_example(n)) for m, n in plan
                                            if m.name != UNMUTATED], jobs,
                                           families=any(PROFILES[p].family for p in profiles))
    todo = [(m, n, prof) for m, n in plan if m.name not in report.compile_failures
            for prof in profiles if (m.name, n, prof) not in done]
    names = {m.name for m in chosen}
    report.outcomes += [o for (name, _, _), o in done.items() if name in names]

    def say(o: Outcome) -> None:
        report.outcomes.append(o)
        if log:
            print(f"{'caught ' if o.caught else 'ESCAPED'} {o.mutant} on {o.schedule} "
                  f"({o.profile}, {o.seconds:.1f} s, {o.examples_run} examples"
                  f"{', budget spent' if o.budget_spent else ''})"
                  f"{': ' + o.how if o.how else ''}"
                  f"{' ' + o.error if o.error else ''}", file=log, flush=True)

    deadline = None if wall_limit_s is None else t_start + wall_limit_s

    def outcomes(items):
        if not isolate:
            return (run_one(m, n, prof, examples, time_budget_s) for m, n, prof in items)
        return _in_processes(items, max(1, parallel), examples, time_budget_s, deadline)

    failing = {}
    if baseline and todo:
        checks = dict.fromkeys((n, prof) for _, n, prof in todo)
        report.baselines += [passed[c] for c in checks if c in passed]
        checks = [c for c in checks if c not in passed]
        for b in outcomes([(_Unmutated(target), n, prof) for n, prof in checks]):
            report.baselines.append(b)
            if log:
                print(f"baseline {b.schedule} ({b.profile}, {b.seconds:.1f} s): "
                      f"{'FAILS unmutated: ' + b.how if b.caught else b.error or 'passes'}",
                      file=log, flush=True)
            if b.caught:
                failing[(b.schedule, b.profile)] = b.how
    for o in outcomes(todo):
        if (o.schedule, o.profile) in failing and not o.error:
            o = replace(o, caught=False,
                        error=f"not counted: the unmutated schedule fails this check "
                              f"({failing[(o.schedule, o.profile)][:120]})")
        say(o)
    return report


def _in_processes(todo, parallel: int, examples, time_budget_s,
                  deadline: Optional[float] = None) -> Iterator[Outcome]:
    """run_one of each (mutant, schedule, profile) in a child process, `parallel` at once;
    past `deadline` (perf_counter) the rest are not reached."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="mlagen-mutants-") as d:
        waiting = list(enumerate(todo))
        running: list = []
        late = "not reached: the harness's wall limit"
        while waiting or running:
            if deadline is not None and time.perf_counter() > deadline:
                for proc, out, m, n, prof, errf, started in running:
                    proc.kill()
                    proc.wait()
                    errf.seek(0)
                    last = (errf.read().strip().splitlines() or [""])[-1][:160]
                    errf.close()
                    # what the stopped run was doing (a build, a worker's start, an example)
                    yield Outcome(m.name, n, prof, False,
                                  error=late + (f" (its last line: {last})" if last else ""),
                                  seconds=time.perf_counter() - started)
                for _, (m, n, prof) in waiting:
                    yield Outcome(m.name, n, prof, False, error=late)
                return
            while waiting and len(running) < parallel:
                i, (m, n, prof) = waiting.pop(0)
                out = Path(d) / f"{i}.json"
                # the parent ran the baselines: a child that ran its own again spent half
                # its time there (and, stopped at the wall limit, reported 0 examples)
                cmd = [sys.executable, "-m", "mlagen.verify.mutants", "--target", m.target,
                       "--only", m.name, "--schedule", n, "--profile", prof, "--no-prebuild",
                       "--in-process", "--no-baseline", "--out", str(out)]
                if examples:
                    cmd += ["--examples", str(examples)]
                if time_budget_s:
                    cmd += ["--time-budget", str(time_budget_s)]
                # a file: a pipe could fill; the child's log lines too, so that a run stopped
                # at the wall limit says how far it got
                errf = open(Path(d) / f"{i}.err", "w+")
                proc = subprocess.Popen(cmd, stdout=errf, stderr=subprocess.STDOUT)
                running.append((proc, out, m, n, prof, errf, time.perf_counter()))
            time.sleep(0.5)
            for item in list(running):
                proc, out, m, n, prof, errf, started = item
                if proc.poll() is None:
                    continue
                running.remove(item)
                errf.seek(0)
                err = errf.read()
                errf.close()
                if proc.returncode < 0:          # killed by a signal: the kernel crashed
                    yield Outcome(m.name, n, prof, True,
                                  f"crash: the verify process died of signal "
                                  f"{-proc.returncode}",
                                  seconds=time.perf_counter() - started)
                    continue
                try:
                    got = json.loads(out.read_text())["outcomes"]
                    yield from (Outcome(**o) for o in got)
                except (OSError, ValueError, KeyError):
                    yield Outcome(m.name, n, prof, False,
                                  error=f"the run's process failed (exit {proc.returncode}): "
                                        f"{(err.strip().splitlines() or ['?'])[-1][:200]}")


def compile_all(target: str, only: Sequence[str] = (), jobs: int = 0, log=None
                ) -> dict[str, Optional[str]]:
    """Compile (objects, no link, no device) every mutant on its first example schedule."""
    from concurrent.futures import ThreadPoolExecutor

    chosen = [m for m in mutants_for(target) if not only or m.name in only]
    jobs = jobs or max(1, (os.cpu_count() or 2) // 2)

    def one(m):
        return m.name, compile_check(m, load_example(m.schedules[0]))

    out = {}
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for name, err in pool.map(one, chosen):
            out[name] = err
            if log:
                print(f"{'compiles' if err is None else 'FAILS   '} {name}"
                      f"{': ' + err if err else ''}", file=log, flush=True)
    return out


def main(argv=None) -> int:
    from ..backends import kinds

    ap = argparse.ArgumentParser(prog="python -m mlagen.verify.mutants",
                                 description="plant one-line faults in the kernel sources and "
                                             "count how many verify catches")
    ap.add_argument("--target", choices=kinds(), default=None)
    ap.add_argument("--profile", action="append", default=None,
                    help="verify profile(s) to run each mutant under (default: smoke)")
    ap.add_argument("--only", action="append", default=[], metavar="MUTANT")
    ap.add_argument("--schedule", action="append", default=[], metavar="EXAMPLE",
                    help="example schedule name(s) instead of each mutant's own")
    ap.add_argument("--examples", type=int, default=None)
    ap.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                    help="per verify run (default: the profile's)")
    ap.add_argument("--jobs", type=int, default=0, help="parallel builds (default: cores / 2)")
    ap.add_argument("--out", default=None, help="write the report as JSON here")
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    ap.add_argument("--first-schedule", action="store_true",
                    help="each mutant on the first of its example schedules only")
    ap.add_argument("--parallel", type=int, default=1, metavar="N",
                    help="verify runs at once, each in its own process (default 1)")
    ap.add_argument("--in-process", action="store_true",
                    help="run verify in this process (default: a process a run)")
    ap.add_argument("--no-prebuild", action="store_true",
                    help="do not build the mutants ahead in parallel (verify builds them)")
    ap.add_argument("--no-baseline", action="store_true",
                    help="do not verify the unmutated schedules first (a mutant caught by a "
                         "check the schedule fails unmutated is then counted caught)")
    ap.add_argument("--shard", default=None, metavar="K/N",
                    help="run the K-th (0-based) of N groups of the schedules only, so that N "
                         "calls run the whole list (each with its schedules' baselines)")
    ap.add_argument("--wall-limit", type=float, default=None, metavar="SECONDS",
                    help="stop the whole run after this long, the rest reported not reached")
    ap.add_argument("--resume", action="append", default=[], metavar="REPORT",
                    help="a report (--out) of an earlier run on the same sources: its finished "
                         "runs and passing baselines are kept, not run again")
    ap.add_argument("--compile-only", action="store_true",
                    help="only check that every mutant applies and compiles (no device)")
    args = ap.parse_args(argv)
    from ..errors import MlagenError
    from .profiles import PROFILES

    if args.list:
        for m in all_mutants():
            if args.target in (None, m.target):
                print(f"{m.target:6} {m.name:28} {m.file:22} {m.what}")
        return 0
    if args.target is None:
        print(f"mlagen: give --target ({' or '.join(kinds())}) or --list", file=sys.stderr)
        return 2
    known = {m.name for m in mutants_for(args.target)} | {UNMUTATED}
    bad = [n for n in args.only if n not in known]
    if bad:
        print(f"mlagen: no {args.target} mutant named {', '.join(bad)}", file=sys.stderr)
        return 2
    profiles = args.profile or ["smoke"]
    shard = None
    if args.shard is not None:
        k, _, n = args.shard.partition("/")
        if not (k.isdigit() and n.isdigit() and 0 <= int(k) < int(n)):
            print(f"mlagen: --shard must be K/N with 0 <= K < N, got {args.shard!r}",
                  file=sys.stderr)
            return 2
        shard = (int(k), int(n))
    if any(p not in PROFILES for p in profiles):
        print(f"mlagen: --profile must be one of {', '.join(PROFILES)}", file=sys.stderr)
        return 2
    try:
        if args.compile_only:
            res = compile_all(args.target, args.only, args.jobs, log=sys.stdout)
            if args.out:
                Path(args.out).write_text(json.dumps(res, indent=1))
            return 0 if all(v is None for v in res.values()) else 1
        from ..backends import backend

        if backend(args.target).device != "cpu":
            why = backend(args.target).device_check()
            if why:
                print(f"mlagen: {why}", file=sys.stderr)
                return 2
        resume = [load_report(f, args.target) for f in args.resume]
        t0 = time.perf_counter()
        rep = run(args.target, profiles, args.only, args.schedule, args.examples,
                  args.time_budget, args.jobs, log=sys.stdout,
                  prebuild_all=False if args.no_prebuild else None,
                  first_schedule=args.first_schedule, parallel=args.parallel,
                  isolate=not args.in_process, wall_limit_s=args.wall_limit, shard=shard,
                  baseline=not args.no_baseline, resume=resume)
    except (MlagenError, ValueError) as e:
        print(f"mlagen: {e}", file=sys.stderr)
        return 2
    print(rep.summary())
    print(f"  {time.perf_counter() - t0:.0f} s in all")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(rep.to_json(), indent=1))
    return 0 if rep.ok() else 1


if __name__ == "__main__":
    sys.exit(main())
