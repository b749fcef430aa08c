"""Verification profiles: how many examples, how random, how big, how long.

    smoke    derandomized; the schedule's family (the builds that reach every compile-time
             branch of its kernels), each member's fixed path cases (strategies.path_cases)
             first, then a few drawn problems of up to 8 sequences: per change
    ci       derandomized (the same examples every run, unless a seed is given), no example
             database, small problems, a wall-clock budget: what tests and CI run
    explore  random, many examples, larger problems, failures remembered in an example
             database under <cache dir>/hypothesis so the next run tries them first; the
             schedule's compile-time knobs are drawn too (one knob at a time around the
             given schedule, each draw through the rules; every variant is built once)

Chosen by `verify(profile=...)`, `mlagen verify --profile`, or $MLAGEN_VERIFY_PROFILE.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Optional

from ..paths import cache_dir

# hypothesis and torch are imported where they are used: `mlagen --help` reads PROFILES.


@dataclass(frozen=True)
class Bounds:
    """Size limits of drawn problems (CPU time grows with batch x length x heads)."""

    max_batch: int = 4
    max_len: int = 300            # ordinary lengths: 0 .. max_len
    long_len: int = 1200          # "long" lengths reach up to this (crossing KV tiles)
    max_extra_table: int = 3      # extra block-table columns pointing at NaN pages

ENV = "MLAGEN_VERIFY_PROFILE"


@dataclass(frozen=True)
class Profile:
    name: str
    examples: int                   # default number of examples
    derandomize: bool
    use_database: bool
    time_budget_s: Optional[float]  # stop drawing new examples after this long (None: never)
    bounds: Bounds
    draw_schedules: bool = False    # draw compile-time knobs too (one build per variant)
    family: bool = False            # build the schedule's family (every compile-time branch)
    path_cases: bool = True         # run strategies.path_cases (fixed branch cases) first

    def with_examples(self, n: Optional[int]) -> "Profile":
        return self if n is None else replace(self, examples=n)


PROFILES = {
    # every compile-time branch of the schedule's family, each member's fixed path cases
    # (many sequences a launch) and a few drawn ones: the check to run on every change
    "smoke": Profile("smoke", examples=30, derandomize=True, use_database=False,
                     time_budget_s=240.0,
                     bounds=Bounds(max_batch=8, max_len=300, long_len=1100, max_extra_table=2),
                     family=True),
    "ci": Profile("ci", examples=100, derandomize=True, use_database=False,
                  time_budget_s=900.0,
                  bounds=Bounds(max_batch=4, max_len=300, long_len=1100, max_extra_table=3),
                  path_cases=False),   # the many tests that run ci keep its cost
    "explore": Profile("explore", examples=2000, derandomize=False, use_database=True,
                       time_budget_s=None,
                       bounds=Bounds(max_batch=8, max_len=700, long_len=4200,
                                     max_extra_table=8), draw_schedules=True),
}


def profile_name(explicit: Optional[str] = None) -> str:
    name = explicit or os.environ.get(ENV) or "ci"
    if name not in PROFILES:
        raise ValueError(f"unknown verification profile {name!r}; one of "
                         f"{', '.join(PROFILES)} (from {'argument' if explicit else ENV})")
    return name


def get_profile(explicit: Optional[str] = None) -> Profile:
    return PROFILES[profile_name(explicit)]


def database_dir():
    return cache_dir() / "hypothesis"


def hypothesis_settings(profile: Profile, examples: Optional[int] = None):
    """The hypothesis settings of a profile (examples overrides the profile's count)."""
    from hypothesis import HealthCheck, settings
    from hypothesis.database import DirectoryBasedExampleDatabase

    db = DirectoryBasedExampleDatabase(str(database_dir())) if profile.use_database else None
    return settings(
        max_examples=examples or profile.examples,
        derandomize=profile.derandomize,
        database=db,
        deadline=None,                  # a first call includes the build; kernels vary
        print_blob=False,
        # problems are drawn from many small pieces and some draws are legitimately slow
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                               HealthCheck.filter_too_much],
    )

