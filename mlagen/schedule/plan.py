"""The checked plan: what ``rules.check`` hands down the pipeline (render, build, run).

A Plan is made once per schedule by the checker; rendering, building and running take it
instead of checking (and loading the target) again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from ..targets import Target
    from .records import Schedule
    from .resources import ResourceReport


@dataclass(frozen=True)
class Plan:
    schedule: "Schedule"
    target: "Target"              # the loaded description the schedule was checked against
    # the target's Backend (mlagen/backends/base.py), which the checker looked up; every
    # step after the check takes it from here.  Not imported: base.py takes Plans.
    backend: Any
    resources: "ResourceReport"   # what it needs of the target (all within what it has)

    @property
    def kind(self) -> str:
        return self.backend.kind

    @property
    def problem(self):
        return self.schedule.problem

    @property
    def mapping(self):
        return self.schedule.mapping

    @property
    def variant(self) -> str:
        return self.schedule.variant_name()
