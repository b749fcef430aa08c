"""The checked plan: what ``rules.check`` hands down the pipeline (render, build, run).

A Plan is made once per schedule by the checker; rendering, building and running take it
instead of checking (and loading the target) again.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

if TYPE_CHECKING:  # pragma: no cover
    from ..backends.base import Backend
    from ..targets import Target
    from .records import Schedule
    from .resources import ResourceReport


@dataclass(frozen=True)
class Plan:
    schedule: "Schedule"
    target: "Target"              # the loaded description the schedule was checked against
    backend: "Backend"
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


_PLANS: dict[tuple, Plan] = {}
_LOCK = threading.Lock()


def plan_of(x: Union["Schedule", Plan]) -> Plan:
    """The plan of a schedule (checked once per process and working directory: a relative
    target file is found from there), or the plan itself."""
    if isinstance(x, Plan):
        return x
    key = (x, os.getcwd())
    with _LOCK:
        got = _PLANS.get(key)
    if got is None:
        from .rules import check

        got = check(x)
        with _LOCK:
            _PLANS[key] = got
    return got


def remember(p: Plan) -> Plan:
    """Keep a plan the checker made (e.g. while loading a file) for ``plan_of``."""
    with _LOCK:
        _PLANS[(p.schedule, os.getcwd())] = p
    return p
