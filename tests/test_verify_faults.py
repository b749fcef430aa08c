"""The verifier's power: every fault the SC11 backend can plant must make `verify` fail,
and no schedule file can plant one."""

import pytest

from mlagen.errors import ScheduleError
from mlagen.paths import SCHEDULES_DIR
from mlagen.schedule import load, loads
from mlagen.schedule.records import BASIC_FAULTS


# A scheme that splits sequences, so faults of the split/merge path are reachable.
def fault_schedule(fault):
    s = load(SCHEDULES_DIR / "sc11_attn.toml")
    if fault == "bad_split_merge":
        s = s.replace(scheme="seq")
    return s.with_fault(fault)


@pytest.mark.parametrize("fault", BASIC_FAULTS)
def test_every_planted_fault_is_caught(fault):
    from mlagen.errors import EmulatorError
    from mlagen.verify import verify

    try:
        r = verify(fault_schedule(fault), profile="ci", examples=200, progress=False,
                   shrink_budget_s=60)
    except EmulatorError:
        return                    # the emulator itself caught it: that counts
    assert not r.ok, f"verify did not catch the planted fault {fault}:\n{r.summary()}"
    assert r.failure.repro_file is not None and r.failure.repro_file.exists()


def test_the_unfaulted_example_passes():
    from mlagen.verify import verify

    r = verify(load(SCHEDULES_DIR / "sc11_attn.toml"), profile="ci", examples=15,
               progress=False)
    assert r.ok, r.summary()
    assert r.poisoned, "the SC11 runner should write into the verifier's NaN-poisoned out="


def test_sc11_runner_writes_into_given_outputs():
    import torch

    from mlagen import runner
    from mlagen.errors import InputError
    from mlagen.problem import make_inputs
    from mlagen.verify.calls import poisoned_like

    s = load(SCHEDULES_DIR / "sc11_attn.toml")
    run = runner(s)
    inp = make_inputs(s.problem, 2, [3, 70], s_q=1, heads=s.heads_per_device, seed=2)
    dest = poisoned_like(inp, (2, 1, 16, 512), (2, 16, 1))
    res = run(inp, out=dest)
    assert res.out.data_ptr() == dest.out.data_ptr() and not torch.isnan(dest.out).any()
    assert not torch.isnan(dest.lse).any()
    bad = poisoned_like(inp, (2, 1, 16, 256), (2, 16, 1))
    with pytest.raises(InputError, match="out.out"):
        run(inp, out=bad)


BASE = """
[problem]
heads = 128
page_size = 64
[target]
kind = "sc11"
[schedule]
tp = 8
"""


@pytest.mark.parametrize("where", ["problem", "schedule", "target"])
def test_a_schedule_file_cannot_plant_a_fault(where):
    text = BASE.replace(f"[{where}]\n", f"[{where}]\nfault = \"wrong_scale\"\n")
    assert "fault" in text
    with pytest.raises(ScheduleError, match="unknown key 'fault'"):
        loads(text, source="x.toml")


def test_a_top_level_fault_key_is_rejected():
    with pytest.raises(ScheduleError):
        loads('fault = "wrong_scale"\n' + BASE, source="x.toml")


def test_loaded_schedules_carry_no_fault():
    assert loads(BASE).fault == "none"
    with pytest.raises(ValueError, match="unknown fault"):
        loads(BASE).with_fault("typo")
