"""verify(schedule): build once, run hypothesis-drawn problems, compare with the reference.

    result = verify(schedule, examples=200, profile="ci")
    result.ok, result.examples_run, result.failure.summary, result.failure.repro_file

On a failure hypothesis shrinks the case (fewer, shorter sequences, smaller seeds), the
smallest failing inputs are saved to a repro file, and the result carries the one-line
command that replays them.  On a GPU target every example runs in a worker process
(isolate.py) so a crash is that example's failure, not the end of the session.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch
from hypothesis import Phase, example, given
from hypothesis import seed as hyp_seed
from hypothesis import strategies as st
from hypothesis import settings as hyp_settings

from ..errors import MlagenError
from ..problem import MlaInputs, MlaOutputs
from ..schedule.parse import dumps
from ..backends import backend
from ..schedule.records import Schedule
from . import repro
from .calls import accepts, call_poisoned
from .compare import Comparison, Tolerance, compare
from .isolate import IsolatedRunner
from .profiles import Profile, get_profile, hypothesis_settings
from .strategies import Bounds, Case, cases, path_cases, schedules
from .strategies import family as family_of



class _BudgetSpent(BaseException):
    """Raised inside an example to stop hypothesis at once (a BaseException passes through
    hypothesis without being shrunk or reported as a failure)."""


class _ExampleFailed(AssertionError):
    """Every failure is raised from one place, so hypothesis treats them as one bug and
    shrinks towards the smallest case that fails in any way."""


@dataclass
class Failure:
    kind: str                        # "mismatch" | "error" | "crash" | "reference"
    message: str                     # comparison summary or the exception
    case: str                        # the case in words
    case_fields: dict = field(default_factory=dict)
    repro_file: Optional[Path] = None
    command: str = ""                # one line that replays it
    shrunk: bool = True              # False when the budget ran out while shrinking
    comparison: Optional[Comparison] = None
    inputs: Optional[MlaInputs] = field(default=None, repr=False)
    schedule: Optional[Schedule] = field(default=None, repr=False)   # the failing variant
    actual: Optional[MlaOutputs] = field(default=None, repr=False)   # the kernel's, a mismatch

    def summary(self) -> str:
        lines = [f"FAILED ({self.kind}) on {self.case}", self.message]
        if not self.shrunk:
            lines.append("(the time budget ran out while shrinking: the case may not be minimal)")
        if self.command:
            lines.append(f"reproduce: {self.command}")
        return "\n".join(lines)


@dataclass
class VerifyResult:
    schedule: str
    variant: str
    profile: str
    ok: bool
    examples_requested: int
    examples_run: int                # examples that ran the kernel to the end
    elapsed_s: float
    setup_s: float                   # making the runner (includes the build, when not cached)
    seed: Optional[int] = None
    failure: Optional[Failure] = None
    budget_spent: bool = False       # stopped early on the profile's time budget
    poisoned: bool = True            # outputs were NaN-poisoned before every run
    notes: list = field(default_factory=list)
    variants_built: int = 1          # compiled variants the run exercised
    phase_s: dict = field(default_factory=dict)   # examples' time: inputs, reference, ...
    workers_ready_s: float = 0.0     # GPU targets: the slowest worker's start, spawn to ready
    runner_made_s: float = 0.0       # ... of which making its runner (a load, or a build)

    def record(self) -> dict:
        """The result as plain data (`mlagen verify --json`): what a script or CI keeps."""
        f = self.failure
        return dict(schedule=self.schedule, variant=self.variant, profile=self.profile,
                    ok=self.ok, examples_requested=self.examples_requested,
                    examples_run=self.examples_run, elapsed_s=round(self.elapsed_s, 3),
                    setup_s=round(self.setup_s, 3), seed=self.seed,
                    budget_spent=self.budget_spent, poisoned=self.poisoned,
                    variants_built=self.variants_built,
                    phase_s={k: round(v, 3) for k, v in self.phase_s.items()},
                    workers_ready_s=round(self.workers_ready_s, 3),
                    runner_made_s=round(self.runner_made_s, 3), notes=list(self.notes),
                    failure=None if f is None else dict(
                        kind=f.kind, message=f.message, case=f.case, command=f.command,
                        repro_file=None if f.repro_file is None else str(f.repro_file)))

    def summary(self) -> str:
        head = (f"{'PASS' if self.ok else 'FAIL'} {self.schedule} [{self.variant}] "
                f"profile {self.profile}: {self.examples_run}/{self.examples_requested} "
                f"examples in {self.elapsed_s:.1f} s (runner ready in {self.setup_s:.1f} s)")
        if self.seed is not None:
            head += f", seed {self.seed}"
        lines = [head]
        if self.budget_spent and self.ok:
            lines.append(f"stopped at the profile's time budget after {self.examples_run} "
                         f"examples")
        lines += self.notes
        if self.failure is not None:
            lines.append(self.failure.summary())
        return "\n".join(lines)

    def __bool__(self) -> bool:
        return self.ok


# Drawn besides shapes and lengths: NaN / inf inputs (the conventions' propagation rule) and
# causal (not the schedule's value alone: non-causal rows at negative positions see keys).
DRAWN = dict(nonfinite=True, draw_causal=True)


def _default_reference(schedule: Schedule) -> Callable[..., MlaOutputs]:
    try:
        from .. import reference  # noqa: F401
    except ImportError as e:
        raise MlagenError("mlagen.reference is not available; verify needs it "
                          f"(or pass reference=...): {e}") from None
    from .oracle import oracle_for

    return oracle_for(schedule)


def repro_command(schedule: Schedule, path: Optional[Path], profile: str,
                  examples: int, seed: Optional[int]) -> str:
    if path is not None:
        return f"mlagen verify --repro {path}"
    if schedule.source and schedule.fault == "none":
        cmd = f"mlagen verify {schedule.source} --profile {profile} --examples {examples}"
        return cmd + (f" --seed {seed}" if seed is not None else "")
    return ""


class _Progress:
    """A rich progress line, or nothing."""

    def __init__(self, enabled: bool, total: int, label: str):
        self.enabled = enabled
        if not enabled:
            return
        from rich.console import Console
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                   TimeElapsedColumn)

        self.bar = Progress(TextColumn("{task.description}"), BarColumn(),
                            MofNCompleteColumn(), TimeElapsedColumn(),
                            console=Console(stderr=True), transient=False)
        self.task = self.bar.add_task(label, total=total)

    def __enter__(self):
        if self.enabled:
            self.bar.__enter__()
        return self

    def __exit__(self, *exc):
        if self.enabled:
            self.bar.__exit__(*exc)

    def advance(self):
        if self.enabled:
            self.bar.advance(self.task)

    def describe(self, text: str):
        if self.enabled:
            self.bar.update(self.task, description=text)


def verify(schedule: Schedule, examples: Optional[int] = None, profile: Optional[str] = None,
           seed: Optional[int] = None, progress: bool = True, *,
           runner: Optional[Callable] = None, reference: Optional[Callable] = None,
           isolate: Optional[bool] = None, runner_factory: str = "mlagen:runner",
           device: Optional[str] = None, bounds: Optional[Bounds] = None,
           tolerances: Optional[dict[str, Tolerance]] = None,
           time_budget_s: Optional[float] = None, shrink_budget_s: Optional[float] = 300.0,
           save_failures: bool = True, failures_dir: Optional[Path] = None,
           example_timeout_s: float = 300.0, draw_schemes: Optional[bool] = None,
           draw_schedules: Optional[bool] = None, family: Optional[bool] = None,
           explicit: Sequence[tuple[Case, Optional[str]]] = (),
           reference_device: Optional[str] = None) -> VerifyResult:
    """Verify a checked schedule's kernel against the float64 reference on drawn problems.

    runner:     a callable MlaInputs -> MlaOutputs (default: mlagen.runner(schedule));
    isolate:    run each example in a worker process (default: on GPU targets); the worker
                makes its runner with `runner_factory` ("module:function" of a schedule);
    reference:  reference(inputs, dtype=torch.float64) -> MlaOutputs (mlagen.reference.run);
    bounds, time_budget_s: override the profile's problem sizes and time budget;
    draw_schemes: where the backend has a run-time scheme choice (scheme = "auto"), draw it
                  per example
                (default: when the runner takes a ``scheme=`` keyword), so one build is
                checked under every multi-core scheme.
    draw_schedules: draw the compile-time knobs too, one at a time around `schedule`
                (strategies.schedules, each draw through the rules); every drawn variant
                is built once and kept for the run (default: the profile's; explore does).
    family:     build the schedule's family too (strategies.family: the builds that reach
                every compile-time branch of its kernels) and draw problems on all of them;
                with it, every member's path cases (strategies.path_cases) run first
                (default: the profile's; smoke does).
    explicit:   (case, scheme) pairs run before any drawn example (hypothesis explicit
                examples), for inputs a test must exercise whatever is drawn.  The explicit
                examples (these, the backend's paths, the path cases) all run whatever the
                time budget; it stops the drawn ones.
    reference_device: where the float64 reference runs (default: the GPU of a GPU target
                when torch sees one -- its cost on the host was most of a run's time --,
                else the CPU); its outputs come back to the host for the comparison.
    """
    prof: Profile = get_profile(profile)
    n = examples if examples is not None else prof.examples
    if n < 1:
        raise ValueError(f"examples = {n} must be >= 1")
    bounds = bounds or prof.bounds
    budget = time_budget_s if time_budget_s is not None else prof.time_budget_s
    be = backend(schedule.target.name)
    gpu = be.device != "cpu"
    isolate = gpu if isolate is None else isolate
    device = device or be.device
    if reference_device is None:
        reference_device = device if gpu and torch.cuda.is_available() else "cpu"
    if draw_schedules is None:
        draw_schedules = prof.draw_schedules and runner is None and reference is None
    elif draw_schedules and (runner is not None or reference is not None):
        raise ValueError("draw_schedules builds its own runners and oracles: "
                         "do not pass runner= or reference=")
    if family is None:
        family = prof.family and runner is None and reference is None
    elif family and (runner is not None or reference is not None):
        raise ValueError("family builds its own runners and oracles: "
                         "do not pass runner= or reference=")

    t0 = time.perf_counter()
    # one kernel (a loaded runner, or a worker process) per compiled variant, built once
    kernels: dict[str, object] = {}
    workers: list[IsolatedRunner] = []
    oracles: dict[str, Callable] = {}

    from .strategies import RUN_KNOBS

    def variant_key(s: Schedule) -> str:
        # run-time knobs (a multi-core scheme, the softmax scale) do not change the build
        same = {k: getattr(schedule.mapping, k) if hasattr(schedule.mapping, k)
                else getattr(schedule.problem, k)
                for k in RUN_KNOBS.get(schedule.target.name, {})}
        return dumps(s.replace(**same)) + s.fault

    def kernel_for(s: Schedule):
        key = variant_key(s)
        if key not in kernels:
            if isolate:
                w = IsolatedRunner(s, factory=runner_factory, device=device,
                                   timeout_s=example_timeout_s)
                w.start()                   # builds and loads once, before timing examples
                workers.append(w)
                kernels[key] = w
            elif runner is not None and s is schedule:
                kernels[key] = runner
            else:
                from .. import runner as make_runner
                kernels[key] = make_runner(s)
        return kernels[key]

    def oracle(s: Schedule) -> Callable:
        if reference is not None:
            return reference
        key = dumps(s) + s.fault
        if key not in oracles:
            oracles[key] = _default_reference(s)
        return oracles[key]

    members = family_of(schedule) if family else [schedule]
    if isolate:
        # the family's workers (the schedule's own among them) start and build at once,
        # before the clock: one build after another inside the run spent its time budget
        # on nvcc, and one start after another its setup on imports and CUDA contexts;
        # this process's own CUDA context (the reference's) is made meanwhile
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=len(members) + 1) as pool:
            if reference_device != "cpu":
                pool.submit(torch.zeros, 1, device=reference_device)
            list(pool.map(kernel_for, members))
    base_kernel = kernel_for(schedule)
    # inputs for the kernel's run-time paths that drawn problems never reach (the real
    # kernel only: a stand-in runner has none of them)
    paths = [] if runner is not None or reference is not None \
        else be.verify_paths(schedule, device)
    explicit = [(None, c, sch) for c, sch in explicit]
    explicit += [(None, Case(schedule.problem, f["batch"], f["s_q"],
                             schedule.heads_per_device, tuple(f["seqlens"]), 0, False, 1), None)
                 for _, f in paths]
    setup_s = time.perf_counter() - t0
    be = backend(schedule.target.name)
    choices = dict(be.runtime_choices(schedule))
    choices.setdefault("scheme", be.tuning_space().get("scheme", ()))
    if draw_schemes is None:
        draw_schemes = (bool(be.runtime_choices(schedule).get("scheme"))
                        and not isolate and accepts(base_kernel, "scheme"))
    scheme_st = st.sampled_from(choices["scheme"]) if draw_schemes else st.none()
    if prof.path_cases and runner is None and reference is None:
        # each member's fixed run-time-branch cases, the schedule's own first; the first
        # (every edge length at once) under every scheme, the others one scheme each
        sch = list(choices["scheme"]) if draw_schemes else [None]
        for s in members:
            for i, c in enumerate(path_cases(s, bounds)):
                for scheme in (sch if i == 0 else [sch[i % len(sch)]]):
                    explicit.append((None if s is schedule else s, c, scheme))
    # a stand-in runner keeps no backend's bad-page contract: no bad pages for it
    drawn_kw = dict(DRAWN, bad_pages=runner is None and reference is None)
    if draw_schedules:
        # the drawn schedule carries its own run-time scheme (the backend's RUN_KNOBS)
        runs_scheme = not isolate and accepts(base_kernel, "scheme")
        drawn = schedules(schedule.target.name, base=schedule, neighbourhood=True).flatmap(
            lambda s: st.tuples(st.just(s), cases(s, bounds, **DRAWN),
                                st.just(getattr(s.mapping, "scheme", None)
                                        if runs_scheme else None)))
    elif family:
        drawn = st.sampled_from(members).flatmap(
            lambda s: st.tuples(st.just(s), cases(s, bounds, **drawn_kw), scheme_st))
    else:
        drawn = st.tuples(st.none(), cases(schedule, bounds, **drawn_kw), scheme_st)

    state = dict(run=0, failure=None, first_fail_t=None, poisoned=True, shrinking=False,
                 calls=0)
    # where the examples' time goes (the summary's "time:" line): a slow profile is
    # located by these, not guessed
    spent = dict(inputs=0.0, reference=0.0, kernel=0.0, compare=0.0)
    n_explicit = len(explicit)

    def run_kernel(s: Schedule, inputs: MlaInputs, want: MlaOutputs,
                   scheme: Optional[str], knobs: tuple = ()) -> MlaOutputs:
        k = kernel_for(s)
        if isinstance(k, IsolatedRunner):
            return k.run(inputs, want.out.shape, want.lse.shape, knobs)
        if knobs and runner is None:
            # a run-time knob of the same build: a runner of its own, kept for the run
            key = (variant_key(s), knobs)
            if key not in kernels:
                from .. import runner as make_runner
                kernels[key] = make_runner(s.replace(**dict(knobs)))
            k = kernels[key]
        kw = {} if scheme is None else {"scheme": scheme}
        outs, poisoned = call_poisoned(k, inputs, want.out.shape, want.lse.shape, **kw)
        state["poisoned"] = state["poisoned"] and poisoned
        return outs

    start = time.perf_counter()
    bar = _Progress(progress, n, f"verify {schedule.name}")

    def check(draw: tuple) -> None:
        sched, case, scheme = draw
        sched = sched or schedule
        now = time.perf_counter()
        state["calls"] += 1
        if state["first_fail_t"] is None:
            # the explicit examples run first, each once: the budget is the drawn ones'
            if budget is not None and state["calls"] > n_explicit and now - start > budget:
                raise _BudgetSpent()
        elif shrink_budget_s is not None and now - state["first_fail_t"] > shrink_budget_s:
            raise _BudgetSpent()
        t = time.perf_counter()
        inputs = case.inputs()
        spent["inputs"] += time.perf_counter() - t
        where = case.describe() + (f", scheme {scheme}" if scheme else "")
        if sched is not schedule:
            where += f", drawn variant {sched.variant_name()} ({_knobs_differing(schedule, sched)})"
        failed: Optional[Failure] = None
        t = time.perf_counter()
        try:
            # compared where the reference ran: float64 over millions of elements was
            # a third of a smoke run's time on the host
            expected = expected_outputs(oracle(sched), inputs, reference_device, host=False)
        except Exception as e:   # noqa: BLE001 - a drawn valid case the reference rejects
            failed = Failure("reference", f"the reference raised {type(e).__name__}: {e}",
                             where)
        spent["reference"] += time.perf_counter() - t
        if failed is None:
            try:
                knobs = () if case.split_kv is None else (("split_kv", case.split_kv),)
                t = time.perf_counter()
                actual = run_kernel(sched, inputs, expected, scheme, knobs)
                t1 = time.perf_counter()
                spent["kernel"] += t1 - t
                cmp = compare(actual, expected, case.problem.dtype, tolerances)
                spent["compare"] += time.perf_counter() - t1
                if not cmp.ok:
                    failed = Failure("mismatch", cmp.summary(), where, comparison=cmp,
                                     actual=actual)
            except Exception as e:   # noqa: BLE001 - any error on a valid case is a failure
                kind = "crash" if type(e).__name__ == "ExampleCrashed" else "error"
                failed = Failure(kind, f"{type(e).__name__}: {e}", where)
        if failed is None:
            state["run"] += 1
            if not state["shrinking"]:
                bar.advance()
            return
        failed.case_fields = dict(_case_fields(case), scheme=scheme)
        failed.inputs = inputs           # kept for the repro file (the last one is minimal)
        failed.schedule = sched
        state["failure"] = failed
        if state["first_fail_t"] is None:
            state["first_fail_t"] = time.perf_counter()
            state["shrinking"] = True
            bar.describe(f"verify {schedule.name}: failed, shrinking")
        raise _ExampleFailed(failed.message)

    settings = hypothesis_settings(prof, n)
    settings = hyp_settings(settings, report_multiple_bugs=False,
                            phases=[Phase.explicit, Phase.reuse, Phase.generate,
                                    Phase.target, Phase.shrink])
    # a stable identity per schedule for the example database (explore) and for the
    # derandomized example sequence (ci): hypothesis hashes the test function's source, so
    # it is this one-line function, not check (whose edits would reshuffle every ci run)
    def example_of(draw: tuple) -> None:
        check(draw)

    example_of._hypothesis_internal_add_digest = (dumps(schedule) + schedule.fault).encode()
    test = given(draw=drawn)(example_of)
    for sched, case, scheme in reversed(explicit):
        test = example(draw=(sched, case, scheme))(test)
    test = settings(test)
    if seed is not None:
        test = hyp_seed(seed)(test)

    budget_spent, shrunk = False, True
    try:
        with bar:
            test()
    except _BudgetSpent:
        budget_spent = True
        shrunk = state["failure"] is None
    except _ExampleFailed:
        pass
    except Exception as e:   # noqa: BLE001 - hypothesis's own errors (flaky, unsatisfiable)
        if state["failure"] is None:
            state["failure"] = Failure("error", f"hypothesis stopped: {type(e).__name__}: {e}",
                                       "(no case)")
    finally:
        for w in workers:
            state["poisoned"] = state["poisoned"] and w.poisoned
            w.stop()            # all told first: they exit at once, not one after another
        for w in workers:
            w.close()
    elapsed = time.perf_counter() - start

    failure: Optional[Failure] = state["failure"]
    if failure is not None:
        failure.shrunk = shrunk if state["first_fail_t"] is not None else True
        inputs = getattr(failure, "inputs", None)
        failed_schedule = getattr(failure, "schedule", None) or schedule
        if save_failures and inputs is not None:
            failure.repro_file = repro.save(failed_schedule, inputs, failure.message,
                                            failure.case_fields, failures_dir, failure.actual)
        failure.command = repro_command(failed_schedule, failure.repro_file, prof.name, n, seed)
    result = VerifyResult(schedule=schedule.name, variant=schedule.variant_name(),
                          profile=prof.name, ok=failure is None,
                          examples_requested=n, examples_run=state["run"],
                          elapsed_s=elapsed, setup_s=setup_s, seed=seed, failure=failure,
                          budget_spent=budget_spent, poisoned=state["poisoned"])
    result.notes.append("time: " + ", ".join(f"{k} {v:.1f} s" for k, v in spent.items())
                        + f" (of {elapsed:.1f} s; the kernel's includes the worker's "
                        f"transfers and any run-time variant it loads)")
    result.phase_s = dict(spent)
    if not state["poisoned"]:
        result.notes.append("note: the runner has no out= hook, so outputs were not "
                            "NaN-poisoned; an element it never writes may go unnoticed")
    for what, f in paths:
        result.notes.append(f"{what}: reached by an explicit input (batch {f['batch']}, "
                            f"s_q {f['s_q']}), run before the drawn ones")
    if family and not draw_schedules:
        result.notes.append(f"family: {len(members)} builds ({len(kernels)} used), "
                            f"every compile-time branch of the schedule's kernels")
        result.variants_built = len(kernels)
    if draw_schedules:
        result.notes.append(f"compile-time knobs drawn: {len(kernels)} variants built "
                            f"(one knob at a time around the schedule, through the rules)")
        result.variants_built = len(kernels)
    elif draw_schemes:
        result.notes.append(f"schemes drawn per example from {', '.join(choices['scheme'])}")
    if workers:
        result.workers_ready_s = max(w.start_s for w in workers)
        result.runner_made_s = max(w.runner_s for w in workers)
        result.notes.append(f"setup: {len(workers)} worker(s) ready in "
                            f"{result.workers_ready_s:.1f} s at most, of which making "
                            f"the runner {result.runner_made_s:.1f} s")
    restarts = sum(w.restarts for w in workers)
    if restarts:
        result.notes.append(f"note: the worker process was restarted {restarts} times")
    return result


def expected_outputs(ref: Callable, inputs: MlaInputs, device: str = "cpu",
                     host: bool = True) -> MlaOutputs:
    """The reference's outputs: where bad block-table entries were planted
    (strategies.plant_bad_pages), on the clean table, with the sequences they hit NaN in
    out and lse (the contract of backends whose bad_pages_give_nan).  device: where the
    reference runs (its outputs, the allowances in extra["slack"] too, come back on the
    host unless host=False: verify compares them where they are)."""
    if device != "cpu":
        meta = dict(inputs.meta)
        if "clean_table" in meta:
            meta["clean_table"] = meta["clean_table"].to(device)
        on = dataclasses.replace(inputs.to(device), meta=meta)
        try:
            want = expected_outputs(ref, on)
        except MlagenError:
            raise                       # the case's own fault: the host would say the same
        except Exception:   # noqa: BLE001 - the device's trouble, not the case's: the host's
            return expected_outputs(ref, inputs)
        if not host:
            return want
        slack = {k: v.cpu() for k, v in want.extra.get("slack", {}).items()}
        return MlaOutputs(want.out.cpu(), want.lse.cpu(),
                          extra={"slack": slack} if slack else {})
    bad = inputs.meta.get("bad_sequences")
    if not bad:
        return ref(inputs, dtype=torch.float64)
    want = ref(dataclasses.replace(inputs, block_table=inputs.meta["clean_table"]),
               dtype=torch.float64)
    for b in bad:
        want.out[b] = float("nan")
        want.lse[b] = float("nan")
    return want


def _knobs_differing(a: Schedule, b: Schedule) -> str:
    import dataclasses as dc

    diff = [f"{f.name} {getattr(b.problem, f.name)}" for f in dc.fields(a.problem)
            if getattr(a.problem, f.name) != getattr(b.problem, f.name)]
    diff += [f"{f.name} {getattr(b.mapping, f.name)}" for f in dc.fields(a.mapping)
             if getattr(a.mapping, f.name) != getattr(b.mapping, f.name)]
    return ", ".join(diff) or "the schedule as given"


def _case_fields(case: Case) -> dict:
    if hasattr(case, "fields"):          # a SparseCase (mlagen.verify.sparse)
        return case.fields()
    return dict(batch=case.batch, s_q=case.s_q, heads=case.heads, seqlens=list(case.seqlens),
                seed=case.seed, q_noncontiguous=case.q_noncontiguous,
                extra_table=case.extra_table, page_size=case.problem.page_size,
                data=case.data, data_arg=case.data_arg,
                bad_pages=[list(b) for b in case.bad_pages], split_kv=case.split_kv,
                dtype=case.problem.dtype, causal=case.causal,
                poisons=[p.describe() for p in case.poisons])


def replay(path: "str | Path | repro.Repro", *, runner: Optional[Callable] = None,
           reference: Optional[Callable] = None, isolate: Optional[bool] = None,
           runner_factory: str = "mlagen:runner", device: Optional[str] = None,
           tolerances: Optional[dict[str, Tolerance]] = None) -> VerifyResult:
    """Run the saved case of a repro file (a path, or one repro.load has read) once and
    compare again."""
    rp = path if isinstance(path, repro.Repro) else repro.load(path)
    schedule = rp.schedule
    ref = reference or _default_reference(schedule)
    gpu = backend(schedule.target.name).device != "cpu"
    isolate = gpu if isolate is None else isolate
    t0 = time.perf_counter()
    expected = expected_outputs(ref, rp.inputs)
    failure = None
    poisoned = True
    try:
        if isolate:
            with IsolatedRunner(schedule, factory=runner_factory,
                                device=device or backend(schedule.target.name).device) as w:
                split = rp.case.get("split_kv")
                actual = w.run(rp.inputs, expected.out.shape, expected.lse.shape,
                               () if split is None else (("split_kv", split),))
                poisoned = w.poisoned
        else:
            if runner is None:
                from .. import runner as make_runner
                runner = make_runner(schedule)
            scheme = rp.case.get("scheme")
            kw = {"scheme": scheme} if scheme and accepts(runner, "scheme") else {}
            actual, poisoned = call_poisoned(runner, rp.inputs, expected.out.shape,
                                             expected.lse.shape, **kw)
        # the storage dtype is q's (an 8-bit cache is not it)
        store = (rp.inputs.q if rp.inputs.q is not None else rp.inputs.q_lora).dtype
        cmp = compare(actual, expected, store, tolerances)
        if not cmp.ok:
            failure = Failure("mismatch", cmp.summary(), _describe(rp), comparison=cmp)
    except Exception as e:   # noqa: BLE001
        failure = Failure("crash" if type(e).__name__ == "ExampleCrashed" else "error",
                          f"{type(e).__name__}: {e}", _describe(rp))
    if failure is not None:
        failure.repro_file, failure.command = rp.path, f"mlagen verify --repro {rp.path}"
    return VerifyResult(schedule=schedule.name, variant=schedule.variant_name(),
                        profile="repro", ok=failure is None, examples_requested=1,
                        examples_run=1 if failure is None else 0,
                        elapsed_s=time.perf_counter() - t0, setup_s=0.0, failure=failure,
                        poisoned=poisoned)


def _describe(rp: "repro.Repro") -> str:
    c = rp.case
    if not c:
        return f"the case saved in {rp.path}"
    return (f"batch {c.get('batch')}, s_q {c.get('s_q')}, heads {c.get('heads')}, "
            f"page {c.get('page_size')}, {c.get('dtype')}, seqlens {c.get('seqlens')}, "
            f"seed {c.get('seed')}" + (f", scheme {c['scheme']}" if c.get("scheme") else ""))

