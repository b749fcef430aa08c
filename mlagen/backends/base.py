"""What a backend (one target kind) provides.  The core calls only these members; each
target's subclass lives in mlagen/backends/<kind>/backend.py as ``BACKEND``.

    kind, mapping                 its name in [target] and its knob record (a Mapping subclass;
                                  field metadata says which knobs are compile-time, and its
                                  variant_parts(s) which fields name a build)
    target_file                   its default description under targets/
    rules(), resources(s, t)      its checks (``rule(s, t) -> (table, key, message)...``) and
                                  its resource counts (``Need``s) against a Target
    render(plan), runner(plan)    sources of a checked plan; a callable MlaInputs -> MlaOutputs
    device, device_check()        where its tensors live; why it cannot run here (or None)
    check_environment()           refuses a malformed environment variable it reads
    tuning_space()                knob -> values the verifier and tuners draw from
    verify_paths(s, device)       inputs for run-time paths that drawn problems never reach
    runtime_shapes(s)             problem shapes its build takes at run time (drawn per example)
    verify_family(s)              the builds beside s that reach its kernels' compile-time branches
    bad_pages_give_nan            a bad block-table entry gives NaN (else the call raises)
    mutants()                     one-line source mutations verify must catch (the harness)
    rounded                       intermediates its kernels round to the storage dtype
    run_point, report(...)        `mlagen run`'s default workload and its extra report
    prebuild(progress)            what else its runtime builds on first use, built ahead by
                                  `mlagen build` (a line saying so, or None)
    bench_main(args)              `mlagen bench --target <kind>`
    tune_main(args)               `mlagen tune --target <kind>` (default: no tuner)
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable, Iterator

if TYPE_CHECKING:  # pragma: no cover
    from ..schedule.plan import Plan
    from ..schedule.records import Mapping, Schedule
    from ..schedule.resources import Need
    from ..targets import Target

Violation = tuple[str, str, str]


class Backend:
    kind: str = ""
    mapping: "type[Mapping]"
    target_file: str = ""
    default: bool = False          # the kind of a schedule that names none
    device: str = "cpu"
    rounded: tuple[str, ...] = ()
    run_point: tuple[int, int] = (1, 64)        # (batch, seqlen) of `mlagen run`
    foreign_why: dict[str, str] = {}            # why another target's knob is wrong here
    kv_formats: tuple[str, ...] = ("bf16", "fp16")   # the KV-cache formats its kernels read
    attentions: tuple[str, ...] = ("dense",)          # dense and/or token-sparse kernels

    def rounded_for(self, s: "Schedule") -> tuple[str, ...]:
        """The rounding points (reference.ROUNDING_POINTS) of one schedule's kernels: the
        backend's, unless a knob changes them."""
        return self.rounded

    # ---- the schedule language -------------------------------------------------------
    def knob_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(self.mapping))

    def rules(self) -> list[Callable[["Schedule", "Target"], Iterator[Violation]]]:
        return []

    def resources(self, s: "Schedule", t: "Target") -> list["Need"]:
        return []

    # ---- the pipeline ----------------------------------------------------------------
    def render(self, plan: "Plan"):
        raise NotImplementedError

    def runner(self, plan: "Plan", progress: "bool | None" = None):
        raise NotImplementedError

    def prebuild(self, progress: bool = False) -> str | None:
        """Build what the runtime would build on its first call besides a schedule's own
        library (`mlagen build` calls it once per target); a line saying what, or None.
        progress: say on stderr what a wait is for."""
        return None

    def check_environment(self) -> None:
        """Refuse a malformed value of an environment variable this target reads
        (mlagen.envvars: an MlagenError naming it); the CLI calls it before any command."""

    def device_check(self) -> str | None:
        """None when this machine can run the kernels; else one line saying why not."""
        return None

    def tuning_space(self) -> dict[str, tuple[Any, ...]]:
        """Knob -> the values the verifier and tuners draw (compile-time knobs: short lists,
        each value is a build)."""
        return {}

    def verify_base(self) -> dict[str, Any]:
        """The knobs of a small schedule the verifier starts from."""
        return {}

    def verify_paths(self, s: "Schedule", device: str) -> list[tuple[str, dict[str, Any]]]:
        """Inputs that reach a path of s's kernels which the verifier's drawn problems never
        do (one chosen at run time by shape): (the path, Case fields batch / s_q / seqlens).
        `verify` runs each before the drawn examples."""
        return []

    def runtime_choices(self, s: "Schedule") -> dict[str, tuple[Any, ...]]:
        """Run-time arguments of the runner the verifier draws per example."""
        return {}

    # whether a sequence with a block-table entry outside the cache comes out NaN (out and
    # lse) rather than raising; the verifier then plants such entries
    bad_pages_give_nan: bool = False

    def runtime_shapes(self, s: "Schedule") -> dict[str, tuple[int, ...]]:
        """Problem shapes s's build takes at run time which steer its kernels' control flow
        ("heads": against tile rows, "page_size": against the key block), as the values
        the verifier draws per example (the schedule's own first).  Default: none, every
        shape is compiled in."""
        return {}

    def verify_pieces(self, s: "Schedule", seqlens: list[int], split_kv: Any
                      ) -> list[tuple[int, int, int]] | None:
        """(sequence, first token, end token) of each piece s's kernels cut the sequences
        into under the run-time split `split_kv` (runtime_shapes' "split_kv"), computed as
        the backend's scheduler does; None where the target has no such split."""
        return None

    def verify_family(self, s: "Schedule") -> list[dict[str, Any]]:
        """Knob sets (Schedule.replace keywords) of the builds that, with s itself, reach
        every compile-time branch of s's kernel family: the smoke profile builds each
        legal one and draws problems on all of them."""
        return []

    def mutants(self) -> tuple:
        """One-line source mutations of its kernels (mlagen.verify.mutation.Mutant) that
        `verify` must catch on the example schedules each names (mlagen.verify.mutants)."""
        return ()

    def boundary_tile(self, s: "Schedule") -> int | None:
        """KV tokens per tile where buffers change hands (lengths around its multiples are
        drawn), or None."""
        return None

    def report(self, plan: "Plan", outputs, chart: str | None) -> None:
        """What `mlagen run` prints after the comparison (nothing by default)."""

    def run_kwargs(self, scheme: str | None) -> dict[str, Any]:
        """Extra keyword arguments of the runner for `mlagen run`'s options (checked here,
        before the build: MlagenError for an option the target does not take)."""
        if scheme is not None:
            from ..errors import MlagenError

            raise MlagenError(f"--scheme: target {self.kind} has no run-time scheme")
        return {}

    def bench_main(self, args) -> int:
        raise NotImplementedError(f"no benchmark for target {self.kind}")

    def tune_main(self, args) -> int:
        """`mlagen tune --target <kind>`: a measured search that sets per-shape defaults."""
        from ..errors import MlagenError

        raise MlagenError(f"target {self.kind} has no tuner (its schedules are chosen by "
                          "their files or its cost model)")

    # ---- models and tensor parallel (mlagen.integrations, mlagen.tprun) --------------
    def latent_decoder(self, weights, softmax_scale: float, *, page_size: int, max_s_q: int,
                       heads_total: int, tp: int, dtype, knobs: dict | None = None):
        """The fused operator of one card's heads (FusedWeights) on a paged latent cache: a
        callable (q_lora, k_cache, block_table, cache_seqlens, k_descale=None) -> out
        [b, s_q, h, v] (k_cache in any format of ``kv_formats``, recognised by its dtype and
        width; k_descale for fp8_e4m3) with ``max_rows`` (query tokens per sequence it
        takes) and ``last`` (its last MlaOutputs, or None); None when this target has none."""
        return None

    def tp_rank_info(self, plan: "Plan", outputs) -> dict[str, Any]:
        """What one rank of a tensor-parallel run reports about its kernel (picklable)."""
        return {}

    def tp_report(self, plan: "Plan", infos: list, tokens: int) -> None:
        """What `mlagen run --tp` prints for the step (e.g. each card's time and the
        collective), from every rank's tp_rank_info."""
