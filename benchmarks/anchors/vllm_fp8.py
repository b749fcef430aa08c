"""The vLLM fork's dense FP8 MLA decode kernel, the anchor of `mlagen bench --vllm-fp8 LIB`
(benchmarks/anchors/README.md): its sources staged from git, then built as a torch extension.

    # where the repositories are (git clones or mirrors, no network needed after):
    python benchmarks/anchors/vllm_fp8.py stage --flashmla REPO --cutlass REPO --dest DIR
    # on the GPU machine (torch with CUDA, nvcc; the GPU image needs the cccl include path):
    CPLUS_INCLUDE_PATH=/usr/local/cuda/include/cccl \\
        python benchmarks/anchors/vllm_fp8.py build --src DIR [--jobs N]
    python benchmarks/anchors/vllm_fp8.py compile --src DIR   # before build, anywhere

`stage` takes github.com/vllm-project/FlashMLA at 46d64a8 (`csrc/extension/sm90/dense_fp8/`
and the `csrc/params.h` it includes) and CUTLASS at e94e888 (the fork's submodule pin:
`include/`, `tools/util/include/`) with `git archive`, so the folder is exactly those
commits (about 26 MB: small enough to travel with a device call).  `build` compiles
`pybind.cpp`, `flash_fwd_mla_fp8_sm90.cu` and `flash_fwd_mla_metadata.cu` with the fork's
own flags and -DNO_PYBIND11=1 (which defines its Python module) for sm_90a through
torch.utils.cpp_extension, and prints the library's path: the LIB of `--vllm-fp8`;
after `compile` (the two CUDA files, which include no torch, into DIR/objects with the same
nvcc and flags) it compiles `pybind.cpp` alone and links them: seconds on the device, not
minutes.  Nothing of either project is copied into this repository.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import staging   # benchmarks/anchors/staging.py (this script's folder is on sys.path)

FLASHMLA_COMMIT = "46d64a8"
CUTLASS_COMMIT = "e94e888"
KERNEL_DIR = "csrc/extension/sm90/dense_fp8"
SOURCES = ("pybind.cpp", "flash_fwd_mla_fp8_sm90.cu", "flash_fwd_mla_metadata.cu")
NAME = "vllm_flashmla_dense_fp8"
# the fork's nvcc flags for its dense FP8 extension (its setup.py), sm_90a only
NVCC = ["-O3", "-std=c++17", "-DNDEBUG", "-D_USE_MATH_DEFINES",
        "-Wno-deprecated-declarations", "-U__CUDA_NO_HALF_OPERATORS__",
        "-U__CUDA_NO_HALF_CONVERSIONS__", "-U__CUDA_NO_HALF2_OPERATORS__",
        "-U__CUDA_NO_BFLOAT16_CONVERSIONS__", "--expt-relaxed-constexpr",
        "--expt-extended-lambda", "--use_fast_math",
        "--ptxas-options=-v,--register-usage-level=10", "-DNO_PYBIND11=1",
        "-gencode", "arch=compute_90a,code=sm_90a"]
CXX = ["-O3", "-std=c++17", "-DNDEBUG", "-Wno-deprecated-declarations", "-DNO_PYBIND11=1"]


def fail(msg: str):
    staging.fail("vllm_fp8", msg)


def stage(flashmla: Path, cutlass: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    n = staging.archive("vllm_fp8", flashmla, FLASHMLA_COMMIT, [KERNEL_DIR, "csrc/params.h"],
                        dest / "flashmla")
    n += staging.archive("vllm_fp8", cutlass, CUTLASS_COMMIT, ["include", "tools/util/include"],
                         dest / "cutlass")
    print(f"staged {n} files of FlashMLA {FLASHMLA_COMMIT} and CUTLASS {CUTLASS_COMMIT} "
          f"in {dest}")


def _staged(src: Path) -> tuple[Path, list[Path]]:
    kernel = src / "flashmla" / KERNEL_DIR
    missing = [s for s in SOURCES if not (kernel / s).is_file()]
    if missing:
        fail(f"{src}: not a staged folder (no {', '.join(missing)}; run `stage` first)")
    return kernel, [src / "flashmla" / "csrc", kernel, src / "cutlass" / "include",
                    src / "cutlass" / "tools" / "util" / "include"]


def _objects(src: Path) -> dict:
    return {s: src / "objects" / (Path(s).stem + ".o") for s in SOURCES if s.endswith(".cu")}


def compile_objects(src: Path, jobs: int) -> list[Path]:
    kernel, includes = _staged(src)
    for s, o in _objects(src).items():
        o.parent.mkdir(parents=True, exist_ok=True)
        cmd = ["nvcc", "-c", str(kernel / s), "-o", str(o), "-Xcompiler", "-fPIC", "--threads",
               str(jobs), *NVCC, *(f"-I{p}" for p in includes)]
        if subprocess.run(cmd).returncode:
            fail(f"nvcc failed on {s}")
    return list(_objects(src).values())


def build(src: Path, jobs: int, out: Path) -> Path:
    from torch.utils.cpp_extension import load

    kernel, includes = _staged(src)
    out.mkdir(parents=True, exist_ok=True)
    objs = list(_objects(src).values())
    if not all(o.is_file() for o in objs):   # `compile` has not run: build the .cu files here
        objs = []
    mod = load(name=NAME, sources=[str(kernel / s) for s in SOURCES
                                   if not (objs and s.endswith(".cu"))],
               extra_cflags=CXX, extra_cuda_cflags=NVCC + ["--threads", str(jobs)],
               extra_ldflags=[str(o.resolve()) for o in objs],
               extra_include_paths=[str(p) for p in includes], build_directory=str(out),
               with_cuda=True, verbose=False)
    return Path(mod.__file__)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("stage", help="the sources, from git, into a folder")
    s.add_argument("--flashmla", type=Path, required=True, help="vllm-project/FlashMLA repo")
    s.add_argument("--cutlass", type=Path, required=True, help="NVIDIA/cutlass repo")
    s.add_argument("--dest", type=Path, required=True)
    b = sub.add_parser("build", help="the torch extension, on a GPU machine")
    b.add_argument("--src", type=Path, required=True, help="a staged folder")
    b.add_argument("--jobs", type=int, default=8, help="nvcc --threads (8)")
    b.add_argument("--out", type=Path, default=None, help="build folder (default SRC/build)")
    c = sub.add_parser("compile", help="the two CUDA files into SRC/objects, ahead of build")
    c.add_argument("--src", type=Path, required=True, help="a staged folder")
    c.add_argument("--jobs", type=int, default=2, help="nvcc --threads (2)")
    a = ap.parse_args()
    if a.cmd == "stage":
        stage(a.flashmla, a.cutlass, a.dest)
    elif a.cmd == "compile":
        print(" ".join(str(o) for o in compile_objects(a.src, a.jobs)))
    else:
        print(build(a.src, a.jobs, a.out or a.src / "build"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
