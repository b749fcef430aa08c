"""Schedule.build(...) -> dumps -> loads gives the same record, over drawn legal knobs of
both targets; the builder and an equivalent file give the same record; the example
schedules load and round-trip."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from mlagen.errors import ResourceError
from mlagen.paths import SCHEDULES_DIR
from mlagen.schedule import Schedule, dumps, load, loads
from mlagen.schedule.parse import _toml_value
from mlagen.backends.hopper.knobs import MAINLOOPS as HOPPER_MAINLOOPS
from mlagen.backends.sc11.knobs import SCHEMES as SC11_SCHEMES
from mlagen.schedule.records import DTYPES, Problem

EXAMPLES = sorted(SCHEDULES_DIR.glob("*.toml"))
PROBLEM_KEYS = {f for f in Problem.__dataclass_fields__}


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def _block_kv(draw, page_size: int, choices: list[int] | None = None) -> int:
    """A block_kv that divides page_size or is a multiple of it (the common rule)."""
    if choices is not None:
        legal = [b for b in choices if page_size % b == 0 or b % page_size == 0]
        assume(legal)
        return draw(st.sampled_from(legal))
    return draw(st.one_of(st.sampled_from(_divisors(page_size)),
                          st.integers(1, 1024 // page_size).map(lambda k: k * page_size)))


def _common(draw) -> dict:
    k = {"dtype": draw(st.sampled_from(DTYPES)),
         "max_s_q": draw(st.integers(1, 8)),
         "causal": draw(st.booleans()),
         "buffers": draw(st.integers(1, 3))}
    scale = draw(st.one_of(st.none(), st.floats(1e-4, 10.0)))
    if scale is not None:
        k["softmax_scale"] = scale
    return k


@st.composite
def sc11_knobs(draw) -> dict:
    heads = draw(st.integers(1, 128))
    tp = draw(st.sampled_from(_divisors(heads)))
    page_size = draw(st.integers(1, 256))
    block_kv = draw(_block_kv(page_size))
    cores = draw(st.integers(1, 8))
    hpd = heads // tp
    hpc = draw(st.sampled_from([0] + [d for d in _divisors(hpd) if hpd // d <= cores]))
    fused = draw(st.booleans())
    k = {"heads": heads, "tp": tp, "page_size": page_size, "block_kv": block_kv,
         "cores": cores, "heads_per_core": hpc, "fused": fused,
         "scheme": draw(st.sampled_from(SC11_SCHEMES)),
         "seq_tile": block_kv * draw(st.integers(1, max(1, 4096 // block_kv))),
         "kv_lora_rank": 64 * draw(st.integers(1, 8)),
         "rope_dim": 16 * draw(st.integers(1 if fused else 0, 4)),
         "qk_nope_head_dim": 16 * draw(st.integers(1, 8)),
         "v_head_dim": 16 * draw(st.integers(1, 8)),
         "q_lora_rank": 16 * draw(st.integers(1, 96))}
    if draw(st.booleans()):
        k["target_file"] = "targets/sc11.toml"      # the default description, named
    k.update(_common(draw))
    return k


@st.composite
def hopper_knobs(draw) -> dict:
    page_size = draw(st.sampled_from([16, 32, 64, 128, 256]) | st.integers(1, 256))
    k = {"heads": (heads := draw(st.sampled_from([16, 32, 64, 128]))),
         "tp": draw(st.sampled_from(_divisors(heads))),
         "page_size": page_size,
         "block_kv": draw(_block_kv(page_size, [16, 32, 64])),
         "rows_per_tile": draw(st.sampled_from([16, 32, 64])),
         "warps": draw(st.sampled_from([4, 8])),
         "mainloop": draw(st.sampled_from(HOPPER_MAINLOOPS)),
         "split_kv": draw(st.one_of(st.just("auto"), st.integers(1, 64)))}
    k.update(_common(draw))
    if k["mainloop"] == "wgmma":       # its knobs are fixed (rules: hopper_mapping)
        k.update(rows_per_tile=64, block_kv=64, buffers=2, warps=8,
                 page_size=draw(st.sampled_from([64, 128, 256])))
    return k


def _build(target: str, knobs: dict) -> Schedule:
    """The builder's record; a schedule over the target's resources, or a main loop not
    implemented yet, is not drawn (everything else drawn here must be legal)."""
    knobs = dict(knobs)
    target_file = knobs.pop("target_file", None)
    try:
        return Schedule.build(name="drawn", target=target, target_file=target_file, **knobs)
    except ResourceError:
        assume(False)
    except Exception as e:
        assume("not implemented" not in str(e))
        raise


def _file_text(target: str, knobs: dict) -> str:
    """The schedule file a user would write for the same knobs."""
    problem = {k: v for k, v in knobs.items() if k in PROBLEM_KEYS}
    mapping = {k: v for k, v in knobs.items() if k not in PROBLEM_KEYS}
    lines = ["[problem]"] + [f"{k} = {_toml_value(v)}" for k, v in problem.items()]
    lines += ["", "[target]", f'kind = "{target}"']
    if knobs.get("target_file"):
        lines.append(f"file = {_toml_value(knobs['target_file'])}")
    lines += ["", "[schedule]"]
    lines += [f"{k} = {_toml_value(v)}" for k, v in mapping.items() if k != "target_file"]
    return "\n".join(lines) + "\n"


SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])


@pytest.mark.parametrize("target,strategy", [("sc11", sc11_knobs()),
                                             ("hopper", hopper_knobs())])
def test_build_dumps_loads_round_trip(target, strategy):
    @SETTINGS
    @given(strategy)
    def check(knobs):
        s = _build(target, knobs)
        again = loads(dumps(s), name=s.name)
        assert again == s
        assert dumps(again) == dumps(s)
        assert again.variant_name() == s.variant_name()

    check()


@pytest.mark.parametrize("target,strategy", [("sc11", sc11_knobs()),
                                             ("hopper", hopper_knobs())])
def test_builder_and_file_make_the_same_record(target, strategy):
    @SETTINGS
    @given(strategy)
    def check(knobs):
        s = _build(target, knobs)
        from_file = loads(_file_text(target, knobs), name=s.name)
        assert from_file == s
        assert s.target.file == knobs.get("target_file")
        for key, value in knobs.items():     # every knob landed where it belongs
            if key == "target_file":
                continue
            record = s.problem if key in PROBLEM_KEYS else s.mapping
            assert getattr(record, key) == value

    check()


def test_dumps_leaves_out_the_other_targets_knobs():
    sc11 = dumps(Schedule.build(target="sc11"))
    hopper = dumps(Schedule.build(target="hopper", rows_per_tile=32, block_kv=32))
    assert "warps" not in sc11 and "seq_tile" in sc11
    assert "seq_tile" not in hopper and "rows_per_tile = 32" in hopper


def test_examples_exist():
    assert {p.stem for p in EXAMPLES} >= {"sc11_attn", "sc11_fused_tp4", "hopper_h200"}


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_loads_and_round_trips(path: Path, tmp_path):
    s = load(path)
    assert s.name == path.stem and s.source == str(path)
    copy = tmp_path / path.name
    copy.write_text(dumps(s))
    again = load(copy)
    assert again == Schedule(problem=s.problem, target=s.target, mapping=s.mapping,
                             name=s.name, source=str(copy))
