"""The schedule language: records, parsing, rules, resources, the checked plan."""

from . import parse as _parse
from .parse import dumps, load, loads
from .plan import Plan
from .rules import plan_of
from .records import FAULTS, Mapping, Problem, Schedule, TargetRef
from .rules import can_implement, check

# records.py sits below the parser; the builder is wired in here (no import cycle).
Schedule._builder = _parse.build

__all__ = ["Schedule", "Problem", "Mapping", "TargetRef", "FAULTS", "Plan", "plan_of", "load",
           "loads", "dumps", "check", "can_implement"]
