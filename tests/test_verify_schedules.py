"""Drawn schedules on the real SC11 backend: every legal draw builds, runs and matches the
reference (a few in the default run, more under -m slow)."""

import pytest
from hypothesis import HealthCheck, given, settings

from mlagen.verify import verify
from mlagen.verify.strategies import Bounds, schedules


SMALL = Bounds(max_batch=3, max_len=200, long_len=600, max_extra_table=2)


def drawn(n, neighbourhood=True):
    """n distinct legal SC11 schedules, drawn (derandomized) by the strategy itself."""
    got = []

    @settings(max_examples=20 * n, derandomize=True, database=None, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    @given(s=schedules("sc11", neighbourhood=neighbourhood))
    def collect(s):
        if s not in got and len(got) < n:
            got.append(s)

    collect()
    return got


@pytest.mark.parametrize("k", range(3))
def test_drawn_schedules_verify(k):
    s = drawn(3)[k]
    r = verify(s, examples=12, progress=False, bounds=SMALL)
    assert r.ok, f"{s.variant_name()} scheme {s.mapping.scheme}:\n{r.summary()}"


@pytest.mark.slow
def test_many_drawn_schedules_verify(request):
    if "slow" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("about 4 minutes: run with -m slow")
    for s in drawn(10, neighbourhood=False):
        r = verify(s, examples=40, progress=False, bounds=SMALL)
        assert r.ok, f"{s.variant_name()} scheme {s.mapping.scheme}:\n{r.summary()}"
