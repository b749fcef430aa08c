"""FlashMLA's token-sparse FP8 decode (V3.2 and DeepSeek-V4's MODEL1), the anchor of
`benchmarks/hopper_sparse.py [--model1]`: its sources staged from git, then built as the
`flash_mla` package for sm_90a.

    python benchmarks/anchors/flashmla_sparse.py stage --flashmla REPO --cutlass REPO --dest DIR
    # on the GPU machine (torch with CUDA, nvcc; the GPU image needs the cccl include path,
    # which `build` sets itself when /usr/local/cuda/include/cccl exists):
    python benchmarks/anchors/flashmla_sparse.py build --src DIR --out OUT [--jobs N] [--full]
    PYTHONPATH=OUT python benchmarks/hopper_sparse.py --model1

`stage` takes github.com/deepseek-ai/FlashMLA at 9241ae3 (the last commit with the Hopper
kernels: `csrc/`, `flash_mla/`, `setup.py`) and CUTLASS at 147f567 (that commit's
`csrc/cutlass` submodule pin: `include/`, `tools/util/include/`, put where the submodule
goes) with `git archive`, so the folder is FlashMLA's tree at that commit less its tests
(about 30 MB: small enough to travel with a device call).

`build` compiles with setup.py's own flags (FLASH_MLA_DISABLE_SM100=1: sm_90a only), but not
its 24 sources (23 .cu): of setup.py's list it keeps the sparse decode's (`csrc/sm90/decode/
sparse_fp8/` V3.2 and MODEL1 at 64 and 128 heads, `csrc/smxx/decode/`: the scheduler
metadata and the combine: 6 .cu files) and replaces `csrc/api/api.cpp` (which binds every
kernel) by a written one that binds `sparse_decode_fwd` alone and defines the SM100 launchers
`csrc/api/sparse_decode.h` names (never called on sm_90) as errors.  FlashMLA's files are
not changed.  `--full` runs FlashMLA's setup.py itself instead (all of it, sm_90a).  Either
way OUT/flash_mla is the package (FlashMLA's Python files and the extension): put OUT on
PYTHONPATH.  Keep OUT outside a carried folder: a device call that carries the staged folder
replaces it.  Nothing of either project is copied into this repository.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import staging   # benchmarks/anchors/staging.py (this script's folder is on sys.path)

FLASHMLA_COMMIT = "9241ae3"
CUTLASS_COMMIT = "147f5673d0c1c3dcf66f78d677fd647e4a020219"   # 9241ae3's csrc/cutlass
# what the sparse decode needs of setup.py's source list (the rest: dense decode, prefill,
# SM100)
KEEP = ("csrc/sm90/decode/sparse_fp8/", "csrc/smxx/decode/")
# setup.py's flags at 9241ae3, sm_90a only (nvcc --threads left out: one arch)
NVCC = ["-O3", "-std=c++20", "-DNDEBUG", "-D_USE_MATH_DEFINES", "-Wno-deprecated-declarations",
        "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__",
        "-U__CUDA_NO_HALF2_OPERATORS__", "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
        "--expt-relaxed-constexpr", "--expt-extended-lambda", "--use_fast_math",
        "--ptxas-options=-v,--register-usage-level=10,--warn-on-spills,"
        "--warn-on-local-memory-usage,--warn-on-double-precision-use",
        "-lineinfo", "--source-in-ptx", "-gencode", "arch=compute_90a,code=sm_90a"]
CXX = ["-O3", "-std=c++20", "-DNDEBUG", "-Wno-deprecated-declarations"]
INCLUDES = ["csrc", "csrc/kerutils/include", "csrc/sm90", "csrc/cutlass/include",
            "csrc/cutlass/tools/util/include"]
CCCL = "/usr/local/cuda/include/cccl"
ENTRY = """\
// mlagen's sm_90a build of FlashMLA 9241ae3's sparse decode alone
// (benchmarks/anchors/flashmla_sparse.py): csrc/api/api.cpp's binding of sparse_decode_fwd,
// and the SM100 launchers sparse_decode.h names, not built here, as errors.
#include <pybind11/pybind11.h>
#include "sparse_decode.h"

namespace sm100::decode::head64 {
template<ModelType MODEL_TYPE>
void run_flash_splitkv_mla_fp8_sparse_kernel(const SparseAttnDecodeParams &) {
    TORCH_CHECK(false, "this FlashMLA build has no SM100 sparse decode (sm_90a only)");
}
template void run_flash_splitkv_mla_fp8_sparse_kernel<ModelType::V32>(
    const SparseAttnDecodeParams &);
template void run_flash_splitkv_mla_fp8_sparse_kernel<ModelType::MODEL1>(
    const SparseAttnDecodeParams &);
}

namespace sm100::fwd_for_small_topk::head128 {
template<SparseAttnFwdMode FWD_MODE, int D_QK>
void run_fwd_for_small_topk_phase1_kernel(const SparseFwdArgT<FWD_MODE> &) {
    TORCH_CHECK(false, "this FlashMLA build has no SM100 sparse decode (sm_90a only)");
}
template void run_fwd_for_small_topk_phase1_kernel<SparseAttnFwdMode::DecodeWithSplitKV, 512>(
    const SparseAttnDecodeParams &);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "FlashMLA 9241ae3, sparse decode only (sm_90a)";
    m.def("sparse_decode_fwd", &sparse_attn_decode_interface);
}
"""


def fail(msg: str):
    staging.fail("flashmla_sparse", msg)


def _archive(repo: Path, commit: str, paths: list[str], dest: Path) -> int:
    return staging.archive("flashmla_sparse", repo, commit, paths, dest)


def stage(flashmla: Path, cutlass: Path, dest: Path) -> None:
    n = _archive(flashmla, FLASHMLA_COMMIT, ["csrc", "flash_mla", "setup.py"], dest)
    n += _archive(cutlass, CUTLASS_COMMIT, ["include", "tools/util/include"],
                  dest / "csrc" / "cutlass")
    print(f"staged {n} files of FlashMLA {FLASHMLA_COMMIT} and CUTLASS {CUTLASS_COMMIT[:7]} "
          f"in {dest}")


def sources(src: Path) -> list[str]:
    """setup.py's source list, in its order."""
    return re.findall(r'"(csrc/[\w/.-]+\.(?:cu|cpp))"', (src / "setup.py").read_text())


def _package(src: Path, out: Path, lib: Path) -> Path:
    """OUT/flash_mla: FlashMLA's Python files and the extension as flash_mla.cuda."""
    pkg = out / "flash_mla"
    pkg.mkdir(parents=True, exist_ok=True)
    for f in (src / "flash_mla").glob("*.py"):
        shutil.copy(f, pkg / f.name)
    with open(pkg / "__init__.py", "a") as f:    # setup.py's version: 1.0.0+<commit>
        f.write(f'\n__version__ = "1.0.0+{FLASHMLA_COMMIT}"\n')
    if lib != pkg / lib.name:
        shutil.copy(lib, pkg / ("cuda" + importlib.machinery.EXTENSION_SUFFIXES[0]))
    return pkg


def build(src: Path, jobs: int, out: Path, full: bool) -> Path:
    src, out = src.resolve(), out.resolve()       # ninja runs in OUT/build
    if not (src / "setup.py").is_file() or not (src / "csrc/cutlass/include").is_dir():
        fail(f"{src}: not a staged folder (run `stage` first)")
    if os.path.isdir(CCCL) and CCCL not in os.environ.get("CPLUS_INCLUDE_PATH", ""):
        os.environ["CPLUS_INCLUDE_PATH"] = ":".join(
            p for p in (CCCL, os.environ.get("CPLUS_INCLUDE_PATH")) if p)
    os.environ["MAX_JOBS"] = str(jobs)             # ninja's parallel compiles
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if full:
        env = dict(os.environ, FLASH_MLA_DISABLE_SM100="1", NVCC_THREADS="1",
                   GIT_DIR=str(out / "no-git"))   # its `git submodule update` finds no repo
        subprocess.run([sys.executable, "setup.py", "build_ext", "--build-lib", str(out),
                        "--build-temp", str(out / "build")], cwd=src, env=env, check=True)
        libs = sorted((out / "flash_mla").glob("cuda*.so"))
        if not libs:
            fail(f"setup.py built no flash_mla/cuda*.so under {out}")
        n, lib = sum(s.endswith(".cu") for s in sources(src)), libs[0]
    else:
        from torch.utils.cpp_extension import load
        keep = [s for s in sources(src) if s.startswith(KEEP)]
        if len(keep) != 6:
            fail(f"{src}/setup.py lists {len(keep)} sparse decode sources, not 6: another commit?")
        bdir = out / "build"
        bdir.mkdir(exist_ok=True)
        entry = bdir / "sparse_decode_api.cpp"
        if not entry.is_file() or entry.read_text() != ENTRY:
            entry.write_text(ENTRY)
        load(name="cuda", sources=[str(entry)] + [str(src / s) for s in keep],
             extra_cflags=CXX, extra_cuda_cflags=NVCC,
             extra_include_paths=[str(src / "csrc" / "api")] + [str(src / p) for p in INCLUDES],
             build_directory=str(bdir), verbose=False, is_python_module=False)
        n, lib = len(keep), bdir / "cuda.so"
    pkg = _package(src, out, lib)
    subprocess.run([sys.executable, "-c", "import flash_mla.cuda"], check=True,
                   env=dict(os.environ, PYTHONPATH=str(out)))   # it loads: no missing symbol
    print(f"built {n} .cu files (FlashMLA {FLASHMLA_COMMIT}, sm_90a"
          f"{', all of setup.py' if full else ', sparse decode only'}) in "
          f"{time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return pkg


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("stage", help="the sources, from git, into a folder")
    s.add_argument("--flashmla", type=Path, required=True, help="deepseek-ai/FlashMLA repo")
    s.add_argument("--cutlass", type=Path, required=True, help="NVIDIA/cutlass repo")
    s.add_argument("--dest", type=Path, required=True)
    b = sub.add_parser("build", help="the flash_mla package, on a GPU machine")
    b.add_argument("--src", type=Path, required=True, help="a staged folder")
    b.add_argument("--out", type=Path, required=True,
                   help="build folder, outside the staged one: OUT/flash_mla is the package")
    b.add_argument("--jobs", type=int, default=8, help="parallel compiles (8)")
    b.add_argument("--full", action="store_true", help="all of FlashMLA's setup.py")
    a = ap.parse_args()
    if a.cmd == "stage":
        stage(a.flashmla, a.cutlass, a.dest)
    else:
        print(build(a.src, a.jobs, a.out, a.full))
    return 0


if __name__ == "__main__":
    sys.exit(main())
