"""The SASS size of each kernel in a cubin: its `.text.<symbol>` section over 16 bytes an
instruction (sm_90), read from the ELF section table with no CUDA tool beyond nvcc.

Code size is a measured cost on Hopper here: every CTA runs its kernel's prologue and
epilogue once from a cold instruction cache, a visible share of a CTA at small batches."""

from __future__ import annotations

import struct
import subprocess
from pathlib import Path

INSTRUCTION_BYTES = 16


def kernel_instructions(cubin: bytes) -> dict[str, int]:
    """{mangled kernel symbol: SASS instructions} of a 64-bit little-endian ELF cubin."""
    if cubin[:4] != b"\x7fELF" or cubin[4] != 2 or cubin[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    sections = [struct.unpack_from("<IIQQQQ", cubin, shoff + i * shentsize)
                for i in range(shnum)]
    names_off = sections[shstrndx][4]

    def name(off: int) -> str:
        end = cubin.index(b"\0", names_off + off)
        return cubin[names_off + off:end].decode()

    out = {}
    for sh_name, _type, _flags, _addr, _offset, size in sections:
        n = name(sh_name)
        if n.startswith(".text."):
            out[n[len(".text."):]] = size // INSTRUCTION_BYTES
    return out


def compile_cubin(source: Path, include: Path, flags: tuple[str, ...], out: Path) -> bytes:
    """nvcc -cubin with the JIT's flags (less -lineinfo: its table is not code)."""
    keep = [f for f in flags if f != "-lineinfo"]
    r = subprocess.run(["nvcc", *keep, "-I", str(include), "-cubin", "-o", str(out),
                        str(source)], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"nvcc failed on {source}:\n{r.stderr}")
    return out.read_bytes()
