"""The schedule language: records, parsing, rules, resources."""

from .parse import dumps, load, loads
from .records import FAULTS, Mapping, Problem, Schedule, TargetRef
from .resources import can_implement
from .rules import check

__all__ = ["Schedule", "Problem", "Mapping", "TargetRef", "FAULTS", "load", "loads", "dumps",
           "check", "can_implement"]
