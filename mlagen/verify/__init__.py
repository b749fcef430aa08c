"""Property-based verification of generated kernels against the float64 reference.

    verify(schedule, examples=N, profile="ci") -> VerifyResult     (runner.py)
    problems(schedule) / schedules(target)                         (strategies.py)
    compare(actual, expected, dtype) -> Comparison                 (compare.py)
    profiles "ci" and "explore"                                    (profiles.py)
    repro files: save / load / replay                              (repro.py, runner.py)
"""

from .compare import TOLERANCES, Comparison, Tolerance, compare
from .profiles import PROFILES, get_profile
from .runner import Failure, VerifyResult, replay, verify
from .strategies import Bounds, Case, cases, problems, schedules

__all__ = ["verify", "replay", "VerifyResult", "Failure", "compare", "Comparison",
           "Tolerance", "TOLERANCES", "PROFILES", "get_profile", "problems", "cases",
           "schedules", "Bounds", "Case"]
