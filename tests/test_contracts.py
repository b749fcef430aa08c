"""Python <-> C++ contracts: each is declared once, in Python, and the C++ side is checked
against that declaration by compiling a probe against the real headers (a field missing on
either side fails to compile; a moved one shows as a different offset).

SC11: the C ABI's argument and result structs (abi.h) against their ctypes records, the
trace record (trace.h) against EVENT_DTYPE and its enums, the scheme numbers (plan.h) and
the planted faults (mla.h) against the tables the renderer fills in."""

from __future__ import annotations

import ctypes
import importlib
import shutil
import subprocess

import pytest

from mlagen.backends.sc11 import trace
from mlagen.paths import TEMPLATES_DIR
from mlagen.schedule.records import FAULTS



def _sc11_attr(name: str):
    """A name of the SC11 backend wherever its modules keep it."""
    for mod in ("mlagen.backends.sc11", "mlagen.backends.sc11.emulator",
                "mlagen.backends.sc11.sources"):
        try:
            m = importlib.import_module(mod)
        except ImportError:
            continue
        if hasattr(m, name):
            return getattr(m, name)
    raise AttributeError(name)


# C++ spellings of the Python enums' members (trace.h prefixes the clashing ones)
_CPP = {"Engine": {"BARRIER": "BARRIER_ENGINE"}, "Mem": {"NONE": "MEM_NONE"},
        "Op": {n: "OP_" + n for n in trace.Op.__members__}}


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    """{name: number} printed by a C++ program built from the Python declarations."""
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("needs a C++ compiler")
    lines = []

    def emit(label: str, expr: str) -> None:
        lines.append(f'  std::printf("%s %lld\\n", "{label}", (long long)({expr}));')

    for struct, record in (("Sc11Args", _sc11_attr("_Args")),
                           ("Sc11Result", _sc11_attr("_Result"))):
        emit(f"{struct}.size", f"sizeof({struct})")
        for name, _ in record._fields_:
            emit(f"{struct}.{name}", f"offsetof({struct}, {name})")
    emit("Event.size", "sizeof(sc11::Event)")
    for name in trace.EVENT_DTYPE.names:
        emit(f"Event.{name}", f"offsetof(sc11::Event, {name})")
    emit("kMaxDeps", "sc11::kMaxDeps")
    for enum in (trace.Engine, trace.Mem, trace.Op):
        for name in enum.__members__:
            emit(f"{enum.__name__}.{name}",
                 f"sc11::{_CPP[enum.__name__].get(name, name)}")
    for name, enum_name in _sc11_attr("FAULT_ENUMS").items():
        emit(f"fault.{name}", f"sc11::{enum_name}")
    for name in _sc11_attr("SCHEME_IDS"):
        emit(f"scheme.{name}", f"sc11::SCHEME_{name.upper()}")
    src = ("#include <cstddef>\n#include <cstdio>\n#include \"mla.h\"\n#include \"plan.h\"\n"
           "int main() {\n" + "\n".join(lines) + "\n  return 0;\n}\n")
    d = tmp_path_factory.mktemp("contracts")
    (d / "probe.cpp").write_text(src)
    build = subprocess.run([cxx, "-std=c++17", "-O0", f"-I{TEMPLATES_DIR / 'sc11' / 'runtime'}",
                            str(d / "probe.cpp"), "-o", str(d / "probe"), "-pthread"],
                           capture_output=True, text=True)
    assert build.returncode == 0, "the C++ side lacks a declared name:\n" + build.stderr[-3000:]
    out = subprocess.run([str(d / "probe")], capture_output=True, text=True, check=True).stdout
    return {k: int(v) for k, v in (ln.split() for ln in out.splitlines())}


@pytest.mark.parametrize("struct,attr", [("Sc11Args", "_Args"), ("Sc11Result", "_Result")])
def test_abi_structs_match_their_ctypes_records(probe, struct, attr):
    record = _sc11_attr(attr)
    assert probe[f"{struct}.size"] == ctypes.sizeof(record)
    for name, _ in record._fields_:
        assert probe[f"{struct}.{name}"] == getattr(record, name).offset, name


def test_trace_record_matches_event_dtype(probe):
    dt = trace.EVENT_DTYPE
    assert probe["Event.size"] == dt.itemsize
    for name in dt.names:
        assert probe[f"Event.{name}"] == dt.fields[name][1], name
    assert probe["kMaxDeps"] == trace.MAX_DEPS
    for enum in (trace.Engine, trace.Mem, trace.Op):
        for name, member in enum.__members__.items():
            assert probe[f"{enum.__name__}.{name}"] == int(member), (enum.__name__, name)


def test_scheme_numbers_and_faults_match_the_headers(probe):
    for name, number in _sc11_attr("SCHEME_IDS").items():
        assert probe[f"scheme.{name}"] == number, name
    fault_enums = _sc11_attr("FAULT_ENUMS")
    assert set(fault_enums) == set(FAULTS)
    values = [probe[f"fault.{name}"] for name in fault_enums]
    assert len(set(values)) == len(values) and probe["fault.none"] == 0


# ---------------------------------------------------------------- Hopper ---------------
def test_hopper_combine_reads_the_partials_its_split_kernel_writes():
    """The 64-row wgmma kernel (mla_wgmma.cuh) writes fp16 partials with row scales, the
    other split kernels fp32 ones: each library's combine is built for its own split
    kernel's format (half_partials), or it would read garbage."""
    from mlagen.backends.hopper import render
    from mlagen.examples import example_schedules
    from mlagen.schedule import load

    seen = set()
    for path in example_schedules():
        sched = load(path)
        if sched.target.kind != "hopper":
            continue
        files = render(sched).files
        half = '#include "mla_wgmma.cuh"' in files["split.cu"]
        assert ("launch_combine_impl<" in files["combine.cu"]
                and (", true>(p, stream)" in files["combine.cu"]) == half), sched.name
        seen.add(half)
    assert seen == {True, False}     # the examples cover both formats


def test_hopper_shape_array_is_read_at_the_declared_indices():
    """api.cu.j2 reads every shape[] entry at the index abi.py declares, each exactly once,
    and the host fills the array by the same names."""
    import re

    from mlagen.backends.hopper import abi, render
    from mlagen.schedule.records import Schedule

    text = render(Schedule.build(target="hopper", heads=16)).files["api.cu"]
    read = re.findall(r"shape\[(\d+)\]", text)
    assert sorted(int(i) for i in read) == list(range(len(abi.SHAPE_FIELDS)))
    for name, i in abi.SHAPE_INDEX.items():
        if name != "lse_offset":
            assert re.search(rf"p\.{name} = (static_cast<int>\()?shape\[{i}\]", text), name
    assert abi.shape_array(**{n: i * 10 for i, n in enumerate(abi.SHAPE_FIELDS)}) == \
        [i * 10 for i in range(len(abi.SHAPE_FIELDS))]
    with pytest.raises(TypeError, match="missing"):
        abi.shape_array(batch=1)
