"""The wgmma shared-memory descriptor that mla_sm90.cuh builds (a tile's descriptor plus an
operand's offset) against the layout of the PTX ISA's matrix descriptor, written out here
independently: bits 0-13 start address >> 4, 16-29 leading byte offset >> 4, 32-45 stride
byte offset >> 4, 62-63 the swizzle mode (1: 128 bytes).  A host program compiled by nvcc
prints the C++ values."""
import random
import subprocess

import pytest


def layout(addr: int, lbo: int, sbo: int) -> int:
    return (((addr & 0x3FFFF) >> 4) | (((lbo >> 4) & 0x3FFF) << 16) |
            (((sbo >> 4) & 0x3FFF) << 32) | (1 << 62))


@pytest.mark.nvcc
def test_descriptor_plus_offset_matches_the_ptx_layout(tmp_path):
    from mlagen.paths import TEMPLATES_DIR

    rng = random.Random(0)
    # the kernels' tiles and operands: 1024-aligned tiles below 227 KiB, offsets of a k step
    # (32 bytes), a V key step (2048), a slice (8192), up to the end of the window
    cases = []
    for _ in range(200):
        tile = rng.randrange(0, 227 * 1024 // 1024) * 1024
        off = rng.randrange(0, (232448 - tile) // 16) * 16
        lbo, sbo = rng.choice([(16, 1024), (8192, 1024)])
        cases.append((tile, off, lbo, sbo))
    cases += [(0, 0, 16, 1024), (226 * 1024, 1008, 8192, 1024), (0x3FC00, 0x3F0, 16, 1024)]
    body = "".join(f'  p({t}u, {o}u, {lb}u, {sb}u);\n' for t, o, lb, sb in cases)
    src = tmp_path / "desc.cu"
    src.write_text(
        '#include <cstdio>\n#include "mla_sm90.cuh"\n'
        'using namespace mlagen::hopper::sm90;\n'
        'static void p(uint32_t t, uint32_t o, uint32_t lbo, uint32_t sbo) {\n'
        '  std::printf("%llu\\n", (unsigned long long)desc_at(make_desc_sw128(t, lbo, sbo), o));\n'
        '}\nint main() {\n' + body + '  return 0;\n}\n')
    exe = tmp_path / "desc"
    subprocess.run(["nvcc", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a",
                    "-I", str(TEMPLATES_DIR / "hopper" / "include"), str(src), "-o", str(exe)],
                   check=True, capture_output=True)
    got = [int(x) for x in subprocess.run([str(exe)], check=True, capture_output=True,
                                          text=True).stdout.split()]
    assert got == [layout(t + o, lb, sb) for t, o, lb, sb in cases]
