"""What `mlagen run` adds for SC11: the simulated timeline, high-water marks, charts."""

from __future__ import annotations

from pathlib import Path
from typing import Optional


def report(plan, out, chart: Optional[str]) -> None:
    from ...console import human_bytes
    from .costmodel import Machine, simulate
    from .timeline import plot_all, plot_core, text_summary

    schedule = plan.schedule
    sim = simulate(out.extra["trace"], Machine.from_target(plan.target))
    print(f"phase-B scheme: {out.extra['scheme']}")
    print(f"LMEM high-water {human_bytes(out.extra['lmem_high'])} per core, "
          f"L2 high-water {human_bytes(out.extra['l2_high'])}")
    print(text_summary(sim))
    prefix = Path(chart) if chart else Path("out") / schedule.name
    prefix.parent.mkdir(parents=True, exist_ok=True)
    files = plot_all(sim, prefix.with_name(prefix.name + "_all_cores"))
    files += plot_core(sim, int(sim.cores[0]), prefix.with_name(prefix.name + "_core0"))
    print("timeline charts: " + ", ".join(str(f) for f in files))
