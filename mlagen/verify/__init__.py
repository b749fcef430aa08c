"""Property-based verification of generated kernels against the float64 reference.

    verify(schedule, examples=N, profile="ci") -> VerifyResult     (runner.py)
    problems(schedule) / schedules(target)                         (strategies.py)
    compare(actual, expected, dtype) -> Comparison                 (compare.py)
    profiles "ci" and "explore"                                    (profiles.py)
    repro files: save / load / replay                              (repro.py, runner.py)
"""

import importlib

# Imported on first use (PEP 562): `mlagen --help` imports mlagen.verify.cli, which must not
# pull in torch and hypothesis.
_WHERE = {"compare": ("TOLERANCES", "Comparison", "Tolerance", "compare"),
          "profiles": ("PROFILES", "get_profile"),
          "runner": ("Failure", "VerifyResult", "replay", "verify"),
          "strategies": ("Bounds", "Case", "cases", "problems", "schedules")}
_MODULE = {name: mod for mod, names in _WHERE.items() for name in names}

__all__ = ["verify", "replay", "VerifyResult", "Failure", "compare", "Comparison",
           "Tolerance", "TOLERANCES", "PROFILES", "get_profile", "problems", "cases",
           "schedules", "Bounds", "Case"]


def __getattr__(name: str):
    if name in _MODULE:
        value = getattr(importlib.import_module(f"{__name__}.{_MODULE[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
