"""The C++ call path (mlagen/backends/hopper/fastcall.cpp) on the CPU: built as a torch
extension against this torch, driven with stub C entries that record what they were given.
A decode plan takes exactly its signature's tensors (anything else: None, and the entry is
never called), allocates out and lse as the Python path does and passes the entry every
pointer, shape[], the scale, the error flags and the stream; a metadata plan likewise for
cache_seqlens; a failed launch raises with the library's own message.  The GPU tests (test_hopper_gpu.py) drive it through the API."""

from __future__ import annotations

import ctypes
import shutil
from pathlib import Path
import subprocess

import pytest
import torch

from mlagen.backends.hopper import fastcall

STUB = r"""
#include <string.h>
long long g_shape[32]; const void* g_ptr[10]; const void* g_descale[3]; float g_scale;
void* g_stream; int g_calls; int g_code;
int mlagen_hopper_decode(const long long* shape, const void* q, const void* k,
    const float* k_descale, const float* q_descale, const float* sink,
    const int* bt, const int* sl, const int* sched, const int* ns, void* out, float* lse,
    float* ws, int* error, float scale_log2, void* stream) {
  memcpy(g_shape, shape, sizeof(g_shape));
  g_descale[0] = k_descale; g_descale[1] = q_descale; g_descale[2] = sink;
  const void* p[10] = {q, k, bt, sl, sched, ns, out, lse, ws, error};
  memcpy(g_ptr, p, sizeof(p));
  g_scale = scale_log2; g_stream = stream; ++g_calls;
  return g_code;
}
const char* mlagen_hopper_error_string(int code) { return code ? "stub error" : "no error"; }
const void* g_mptr[3]; int g_mint[4]; void* g_mstream; int g_mcalls;
int mlagen_hopper_metadata(const int* seqlens, int batch, int num_parts, int fixed_cost,
    int fixed_splits, int* sched, int* num_splits, void* stream) {
  const void* p[3] = {seqlens, sched, num_splits};
  memcpy(g_mptr, p, sizeof(p));
  int v[4] = {batch, num_parts, fixed_cost, fixed_splits};
  memcpy(g_mint, v, sizeof(v));
  g_mstream = stream; ++g_mcalls;
  return g_code;
}
"""

B, S_Q, H_Q, PAGE, NB, MAXB, PARTS = 3, 2, 16, 64, 10, 4, 5
OUT_SHAPE, LSE_SHAPE = (B, S_Q, H_Q, 512), (B, H_Q, S_Q)
SHAPE = list(range(100, 132))          # shape[]: any 32 values the entry must get verbatim
WS = 4096


@pytest.fixture(scope="module")
def ext(tmp_path_factory):
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler")
    m = fastcall.module()
    assert m is not None, "the extension did not build (see the warning)"
    d = tmp_path_factory.mktemp("stub")
    (d / "stub.c").write_text(STUB)
    subprocess.run([shutil.which("cc") or "gcc", "-shared", "-fPIC", "-O1", "-o",
                    str(d / "stub.so"), str(d / "stub.c")], check=True)
    return m, ctypes.CDLL(str(d / "stub.so"))


def inputs(dtype=torch.bfloat16):
    q = torch.randn(B, S_Q, H_Q, 576).to(dtype)
    k = torch.randn(NB, PAGE, 1, 576).to(dtype)
    bt = torch.arange(B * MAXB, dtype=torch.int32).reshape(B, MAXB) % NB
    sl = torch.tensor([1, 64, 200], dtype=torch.int32)
    md = torch.zeros(PARTS, 8, dtype=torch.int32)
    ns = torch.zeros(B + 1, dtype=torch.int32)
    return [q, k, bt, sl, md, ns]


def make_plan(ext, like, scale_log2=0.25, error=0x1230):
    m, stub = ext
    return fastcall.decode_plan(like, stub, SHAPE, OUT_SHAPE, LSE_SHAPE, WS, error, scale_log2)


def calls(stub) -> int:
    return ctypes.c_int.in_dll(stub, "g_calls").value


def test_a_matching_call_reaches_the_entry_with_everything(ext):
    m, stub = ext
    like = inputs()
    plan = make_plan(ext, like, scale_log2=0.1)
    args = inputs()                       # other tensors, same signature
    ws = torch.empty(WS, dtype=torch.float32)
    n0 = calls(stub)
    out, lse = plan.run(*args, 0xABC0, ws)
    assert calls(stub) == n0 + 1
    assert out.shape == OUT_SHAPE and out.dtype == torch.bfloat16 and out.is_contiguous()
    assert lse.shape == LSE_SHAPE and lse.dtype == torch.float32 and lse.is_contiguous()
    got = list((ctypes.c_longlong * 32).in_dll(stub, "g_shape"))
    assert got == SHAPE
    ptrs = [p or 0 for p in (ctypes.c_void_p * 10).in_dll(stub, "g_ptr")]
    assert ptrs == [t.data_ptr() for t in args] + [out.data_ptr(), lse.data_ptr(),
                                                   ws.data_ptr(), 0x1230]
    # the C++ path serves 16-bit caches alone: no descales
    assert [p or 0 for p in (ctypes.c_void_p * 3).in_dll(stub, "g_descale")] == [0, 0, 0]
    assert ctypes.c_float.in_dll(stub, "g_scale").value == pytest.approx(0.1, rel=1e-7)
    assert ctypes.c_void_p.in_dll(stub, "g_stream").value == 0xABC0
    out2, _ = plan.run(*args, 0xABC0, ws)   # fresh outputs each call
    assert out2.data_ptr() != out.data_ptr()


def test_fp16_outputs_follow_q(ext):
    like = inputs(torch.float16)
    out, lse = make_plan(ext, like).run(*inputs(torch.float16), 0,
                                        torch.empty(WS, dtype=torch.float32))
    assert out.dtype == torch.float16 and lse.dtype == torch.float32


def _variants(t: torch.Tensor):
    """Tensors that differ from t in one way each: size, stride, dtype."""
    yield "size", torch.zeros(*t.shape[:-1], t.shape[-1] + 1, dtype=t.dtype)[..., :].clone()
    wide = torch.zeros(*t.shape[:-1], t.shape[-1] * 2 + 8, dtype=t.dtype)
    yield "stride", wide[..., :t.shape[-1]] if t.dim() > 1 else wide[::2][:t.shape[0]]
    other = torch.float16 if t.dtype != torch.float16 else torch.bfloat16
    yield "dtype", t.to(torch.int64 if t.dtype == torch.int32 else other)


@pytest.mark.parametrize("which", range(6))
def test_any_other_signature_is_not_this_plans(ext, which):
    """size, stride or dtype of any one of the six inputs changed: None, the entry not called
    (the Python path then checks the call and says what is wrong, or makes its plan)."""
    m, stub = ext
    plan = make_plan(ext, inputs())
    ws = torch.empty(WS, dtype=torch.float32)
    for what, t in _variants(inputs()[which]):
        args = inputs()
        args[which] = t
        n0 = calls(stub)
        assert plan.run(*args, 0, ws) is None, what
        assert calls(stub) == n0, what


def test_misaligned_rows_and_small_workspace_are_not_taken(ext):
    m, stub = ext
    plan = make_plan(ext, inputs())
    ws = torch.empty(WS, dtype=torch.float32)
    n0 = calls(stub)
    for which in (0, 1):      # q or k_cache starting 2 bytes off a 16-byte boundary
        args = inputs()
        t = args[which]
        base = torch.zeros(t.numel() + 8, dtype=t.dtype)
        args[which] = base[1:1 + t.numel()].view(t.shape)
        assert args[which].stride() == t.stride() and args[which].data_ptr() % 16
        assert plan.run(*args, 0, ws) is None
    assert plan.run(*inputs(), 0, torch.empty(WS - 1, dtype=torch.float32)) is None
    assert plan.run(*inputs(), 0, torch.empty(WS, dtype=torch.float16)) is None
    assert calls(stub) == n0
    assert plan.run(*inputs(), 0, ws) is not None


def test_a_failed_launch_raises_with_the_librarys_message(ext):
    m, stub = ext
    plan = make_plan(ext, inputs())
    ctypes.c_int.in_dll(stub, "g_code").value = 7
    try:
        with pytest.raises(RuntimeError, match="CUDA error 7: stub error"):
            plan.run(*inputs(), 0, torch.empty(WS, dtype=torch.float32))
    finally:
        ctypes.c_int.in_dll(stub, "g_code").value = 0


def test_turned_off_means_no_module(monkeypatch):
    monkeypatch.setenv("MLAGEN_HOPPER_FASTCALL", "0")
    monkeypatch.setattr(fastcall, "_MODULE", [])
    assert fastcall.module() is None


def test_a_failed_build_warns_once_and_leaves_the_python_path(monkeypatch, tmp_path):
    """No compiler: one RuntimeWarning naming the folder, then None for every plan."""
    from torch.utils import cpp_extension

    def broken(*a, **k):
        raise RuntimeError("Error building extension 'mlagen_hopper_fastcall'\ndetails")

    monkeypatch.setattr(fastcall, "_MODULE", [])
    monkeypatch.setattr(cpp_extension, "load", broken)
    monkeypatch.setenv("MLAGEN_CACHE_DIR", str(tmp_path))
    with pytest.warns(RuntimeWarning, match="did not build in .*Error building extension"):
        assert fastcall.module() is None
    assert fastcall.decode_plan(inputs(), None, SHAPE, OUT_SHAPE, LSE_SHAPE, WS, 0, 1.0) is None
    assert fastcall.metadata_plan(inputs()[3], None, 4, 0, 5) is None


def test_metadata_plan_reaches_the_entry_with_everything(ext):
    from mlagen.backends.hopper import scheduler

    m, stub = ext
    assert m.META_INTS == scheduler.META_INTS      # the C++ copy of the metadata row size
    sl = inputs()[3]
    plan = fastcall.metadata_plan(sl, stub, 7, 2, 5)
    other = torch.tensor([5, 6, 7], dtype=torch.int32)
    n0 = ctypes.c_int.in_dll(stub, "g_mcalls").value
    sched, ns = plan.run(other, 0x77)
    assert ctypes.c_int.in_dll(stub, "g_mcalls").value == n0 + 1
    assert sched.shape == (7, scheduler.META_INTS) and sched.dtype == torch.int32
    assert ns.shape == (B + 1,) and ns.dtype == torch.int32
    ptrs = [p or 0 for p in (ctypes.c_void_p * 3).in_dll(stub, "g_mptr")]
    assert ptrs == [other.data_ptr(), sched.data_ptr(), ns.data_ptr()]
    assert list((ctypes.c_int * 4).in_dll(stub, "g_mint")) == [B, 7, 5, 2]
    assert ctypes.c_void_p.in_dll(stub, "g_mstream").value == 0x77
    wide = torch.zeros(2 * B, dtype=torch.int32)
    for t in (torch.zeros(B + 1, dtype=torch.int32), wide[::2], sl.long()):
        assert plan.run(t, 0) is None
    assert ctypes.c_int.in_dll(stub, "g_mcalls").value == n0 + 1
    ctypes.c_int.in_dll(stub, "g_code").value = 7
    try:
        with pytest.raises(RuntimeError, match="scheduler launch: CUDA error 7: stub error"):
            plan.run(other, 0)
    finally:
        ctypes.c_int.in_dll(stub, "g_code").value = 0


def test_the_build_folder_names_the_source_torch_and_python(monkeypatch, tmp_path):
    import hashlib
    import sys

    monkeypatch.setenv("MLAGEN_CACHE_DIR", str(tmp_path))
    d = fastcall.build_dir()
    assert d.parent == tmp_path / "torch_ext"
    assert hashlib.sha256(fastcall.SOURCE.read_bytes()).hexdigest()[:12] in d.name
    assert f"py{sys.version_info[0]}{sys.version_info[1]}" in d.name
    assert torch.__version__.replace("+", "_") in d.name


def _cli_build(monkeypatch, capsys, schedules):
    """`mlagen build` with the kernel libraries' build stubbed (no nvcc needed): the lines
    it prints and its status."""
    from types import SimpleNamespace

    import mlagen
    from mlagen import cli

    monkeypatch.setattr(mlagen, "build", lambda s, progress=None: SimpleNamespace(
        built=False, path=f"/cache/{s.name}.so"))
    rc = cli.main(["build", *schedules])
    return rc, capsys.readouterr().out.splitlines()


def test_mlagen_build_builds_the_cpp_call_path_ahead_once_per_target(monkeypatch, capsys,
                                                                     tmp_path):
    """The first eager call would build the extension (~15 s): `mlagen build` does it
    instead, once for however many Hopper schedules, and says where it lies; an SC11
    schedule adds nothing."""
    from mlagen.paths import DATA_ROOT

    calls = []

    def load(*a, **k):
        calls.append(k["build_directory"])
        return object()

    from torch.utils import cpp_extension

    monkeypatch.setattr(fastcall, "_MODULE", [])
    monkeypatch.setattr(cpp_extension, "load", load)
    monkeypatch.setenv("MLAGEN_CACHE_DIR", str(tmp_path))
    sch = DATA_ROOT / "schedules"
    rc, lines = _cli_build(monkeypatch, capsys, [str(sch / "hopper_wgmma.toml"),
                                                 str(sch / "hopper_wgmma_r16.toml"),
                                                 str(sch / "sc11_fused_tp4.toml")])
    assert rc == 0 and calls == [str(fastcall.build_dir())]
    assert [ln.split(":")[0] for ln in lines] == ["hopper_wgmma", "hopper_wgmma_r16",
                                                  "sc11_fused_tp4", "C++ call path"]
    assert lines[-1].startswith("C++ call path: built in ")
    assert lines[-1].endswith(str(fastcall.library_path()))
    # built before (its .so in the folder): said so
    fastcall.library_path().parent.mkdir(parents=True, exist_ok=True)
    fastcall.library_path().write_bytes(b"\x7fELF")
    from mlagen.jit.integrity import record_beside

    record_beside(fastcall.library_path())      # what a build that loaded records
    monkeypatch.setattr(fastcall, "_MODULE", [])
    rc, lines = _cli_build(monkeypatch, capsys, [str(sch / "hopper_wgmma.toml")])
    assert rc == 0 and lines[-1].startswith("C++ call path: cached in ")
    rc, lines = _cli_build(monkeypatch, capsys, [str(sch / "sc11_fused_tp4.toml")])
    assert rc == 0 and len(lines) == 1 and len(calls) == 2


def test_mlagen_build_says_why_the_cpp_call_path_did_not_build(monkeypatch, capsys, tmp_path):
    """A failed extension build is not a failed `mlagen build` (the Python path serves every
    call): status 0 and one line naming the compiler's first line (not the API's warning
    too); turned off, it says so."""
    from torch.utils import cpp_extension

    from mlagen.paths import DATA_ROOT

    def broken(*a, **k):
        raise RuntimeError("Error building extension 'mlagen_hopper_fastcall'\ndetails")

    monkeypatch.setattr(fastcall, "_MODULE", [])
    monkeypatch.setattr(fastcall, "_ERROR", [])
    monkeypatch.setattr(cpp_extension, "load", broken)
    monkeypatch.setenv("MLAGEN_CACHE_DIR", str(tmp_path))
    hopper = str(DATA_ROOT / "schedules" / "hopper_wgmma.toml")
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rc, lines = _cli_build(monkeypatch, capsys, [hopper])
    assert rc == 0 and not [w for w in caught if issubclass(w.category, RuntimeWarning)]
    assert lines[-1] == ("C++ call path: not built (Error building extension "
                         "'mlagen_hopper_fastcall'); eager calls take the Python path")
    monkeypatch.setenv("MLAGEN_HOPPER_FASTCALL", "0")
    monkeypatch.setattr(fastcall, "_MODULE", [])
    rc, lines = _cli_build(monkeypatch, capsys, [hopper])
    assert rc == 0 and lines[-1] == "C++ call path: off (MLAGEN_HOPPER_FASTCALL=0)"


class _FakePlan:
    """A cached plan as api.py sees it: its tail and a run_fast that records its calls."""

    def __init__(self, tail, result):
        self.tail, self.result, self.calls = tail, result, 0
        self.fast = object()

    def run_fast(self, *args):
        self.calls += 1
        return self.result


def _decode_args():
    q = torch.zeros(2, 1, 16, 576, dtype=torch.bfloat16)
    k = torch.zeros(4, 64, 1, 576, dtype=torch.bfloat16)
    bt = torch.zeros(2, 2, dtype=torch.int32)
    sl = torch.ones(2, dtype=torch.int32)
    md = torch.zeros(3, 8, dtype=torch.int32)
    ns = torch.zeros(3, dtype=torch.int32)
    return q, k, bt, sl, 512, md, ns


def test_the_api_takes_the_last_plans_cpp_path_only_for_its_own_calls(monkeypatch):
    """Routing in api.py, on CPU tensors (the Python path then refuses them, which shows it
    ran): the last plan's run_fast answers a call with its tail (head_dim_v, scale, causal,
    schedule); another tail, a None from run_fast, strict mode or out= go to the Python path."""
    from mlagen.backends.hopper import api, ops
    from mlagen.errors import InputError

    sentinel = (torch.zeros(1), torch.zeros(1))
    plan = _FakePlan((512, None, True, None), sentinel)
    monkeypatch.setattr(api, "_LAST", [plan])
    args = _decode_args()
    assert api.flash_mla_with_kvcache(*args, causal=True) is sentinel
    assert plan.calls == 1
    for kw in (dict(causal=False), dict(causal=True, softmax_scale=0.5)):
        with pytest.raises(InputError, match="CUDA"):
            api.flash_mla_with_kvcache(*args, **kw)
    assert plan.calls == 1
    with pytest.raises(InputError, match="out="):
        api.flash_mla_with_kvcache(*args, causal=True, out=(torch.zeros(1), torch.zeros(1)))
    monkeypatch.setattr(ops, "STRICT", True)
    with pytest.raises(InputError, match="CUDA"):
        api.flash_mla_with_kvcache(*args, causal=True)
    assert plan.calls == 1
    monkeypatch.setattr(ops, "STRICT", False)
    plan.result = None                       # not the plan's signature
    with pytest.raises(InputError, match="CUDA"):
        api.flash_mla_with_kvcache(*args, causal=True)
    assert plan.calls == 2


def test_the_metadata_call_takes_the_last_plans_cpp_path_only_for_its_own_calls(monkeypatch):
    from mlagen.backends.hopper import api
    from mlagen.errors import InputError

    sentinel = (torch.zeros(1), torch.zeros(1))
    plan = _FakePlan((16, 1, None, ""), sentinel)   # tail: heads, h_kv, schedule, kv
    monkeypatch.setattr(api, "_LAST_METADATA", [plan])
    sl = torch.ones(2, dtype=torch.int32)
    assert api.get_mla_metadata(sl, 16, 1) is sentinel
    with pytest.raises(InputError, match="CUDA"):
        api.get_mla_metadata(sl, 32, 1)       # another tail
    plan.result = None
    with pytest.raises(InputError, match="CUDA"):
        api.get_mla_metadata(sl, 16, 1)
    assert plan.calls == 2


@pytest.mark.parametrize("how", ["truncate", "empty", "garble", "unrecorded"])
def test_a_damaged_extension_is_named_and_rebuilt_before_it_is_loaded(monkeypatch, capsys,
                                                                      tmp_path, how):
    """torch's own staleness check takes a short .so for an up-to-date one, and importing
    it can kill the process with a bus error: the size and sha256 recorded after the build
    are checked first, and a damaged library is removed so that torch builds it again."""
    from torch.utils import cpp_extension

    seen = []

    def load(*a, **k):                  # stands in for the build: makes the library
        lib = fastcall.library_path()
        seen.append(lib.exists())
        if not lib.exists():
            lib.write_bytes(b"\x7fELF" + bytes(range(256)) * 20)
        return object()

    monkeypatch.setattr(cpp_extension, "load", load)
    monkeypatch.setenv("MLAGEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(fastcall, "_MODULE", [])
    assert fastcall.module() is not None and seen == [False] and fastcall.intact()
    lib = fastcall.library_path()
    data = lib.read_bytes()
    if how == "truncate":
        lib.write_bytes(data[:1000])
    elif how == "empty":
        lib.write_bytes(b"")
    elif how == "garble":
        lib.write_bytes(bytes(b ^ 0x5A for b in data))
    else:                               # a library copied in without its record
        Path(str(lib) + ".integrity.json").unlink()
    assert not fastcall.intact()
    capsys.readouterr()
    monkeypatch.setattr(fastcall, "_MODULE", [])
    assert fastcall.module() is not None
    assert seen == [False, False], "the damaged library reached the loader"
    assert f"cache entry {fastcall.build_dir()} is damaged" in capsys.readouterr().err
    assert fastcall.intact() and lib.read_bytes() == data
    monkeypatch.setattr(fastcall, "_MODULE", [])
    assert fastcall.module() is not None and seen == [False, False, True]   # intact: kept
