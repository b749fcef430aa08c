"""How many two-CTA clusters of the 64-row wgmma kernel's shape the GPU holds at once (GPU
only): a K-multicast cluster (a part's two row tiles sharing each K block) needs all its
parts' clusters resident together, and a cluster's two CTAs must sit in one GPC.  Branch
`cluster` (docs/hopper.md step 7) measured 0.79-0.87x; if fewer than `parts` clusters fit
(66 on 132 SMs), part of that was a second wave, not the coupling of the two pipelines.

    python benchmarks/cluster_fit.py

Builds a stand-in kernel with the real kernel's threads and shared memory
(WgmmaConfig::kThreads, kSmem from mla_wgmma.cuh) and asks
cudaOccupancyMaxActiveClusters for cluster sizes 1, 2, 4 and 8 (a 4-CTA merge needs all
its clusters resident: 32 of them for b = 16 s_q = 2's 128 CTAs).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

SRC = r'''
#include <cstdio>
#include "mla_wgmma.cuh"
using C = mlagen::hopper::WgmmaConfig;
__global__ void __launch_bounds__(C::kThreads, 1) stand_in() {
  extern __shared__ unsigned char smem[];
  if (threadIdx.x == 1u << 30) smem[0] = 0;
}
int main() {
  if (cudaFuncSetAttribute(stand_in, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmem) !=
      cudaSuccess) { std::printf("smem attribute refused\n"); return 1; }
  cudaFuncSetAttribute(stand_in, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  for (int size : {1, 2, 4, 8}) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(sms / size, size, 1);
    cfg.blockDim = dim3(C::kThreads, 1, 1);
    cfg.dynamicSmemBytes = C::kSmem;
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = 1;
    attr.val.clusterDim.y = size;
    attr.val.clusterDim.z = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    int n = 0;
    cudaError_t e = cudaOccupancyMaxActiveClusters(&n, stand_in, &cfg);
    std::printf("cluster of %d: %d clusters at once (%d CTAs of %d SMs; smem %d, threads %d)%s\n",
                size, n, n * size, sms, C::kSmem, C::kThreads,
                e == cudaSuccess ? "" : cudaGetErrorString(e));
  }
  return 0;
}
'''


def main() -> int:
    inc = Path(__file__).resolve().parent.parent / "templates" / "hopper" / "include"
    with tempfile.TemporaryDirectory() as d:
        src, exe = Path(d) / "fit.cu", Path(d) / "fit"
        src.write_text(SRC)
        try:
            subprocess.run(["nvcc", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a",
                            "-I", str(inc), str(src), "-o", str(exe)], check=True)
        except (OSError, subprocess.CalledProcessError) as e:
            print(f"cluster_fit: could not build the stand-in kernel with nvcc: {e}",
                  file=sys.stderr)
            return 2
        return subprocess.run([str(exe)]).returncode


if __name__ == "__main__":
    sys.exit(main())
