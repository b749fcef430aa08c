"""The SASS size of each kernel in a cubin: its `.text.<symbol>` section over 16 bytes an
instruction (sm_90), read from the ELF section table with no CUDA tool beyond nvcc.

Code size is a measured cost on Hopper here: every CTA runs its kernel's prologue and
epilogue once from a cold instruction cache, a visible share of a CTA at small batches."""

from __future__ import annotations

import struct
import subprocess
from pathlib import Path
from typing import Sequence

INSTRUCTION_BYTES = 16


def _section_table(cubin: bytes) -> list[tuple[str, int, int, int]]:
    """(name, type, offset, size) of each section of a 64-bit little-endian ELF file."""
    if cubin[:4] != b"\x7fELF" or cubin[4] != 2 or cubin[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    heads = [struct.unpack_from("<IIQQQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
    names_off = heads[shstrndx][4]
    out = []
    for sh_name, kind, _flags, _addr, offset, size in heads:
        end = cubin.index(b"\0", names_off + sh_name)
        out.append((cubin[names_off + sh_name:end].decode(), kind, offset, size))
    return out


def elf_sections(cubin: bytes) -> dict[str, bytes]:
    """{section name: its bytes} of a 64-bit little-endian ELF file (NOBITS sections empty)."""
    return {n: b"" if kind == 8 else cubin[off:off + size]
            for n, kind, off, size in _section_table(cubin)}


def kernel_instructions(cubin: bytes) -> dict[str, int]:
    """{mangled kernel symbol: SASS instructions} of a 64-bit little-endian ELF cubin."""
    return {n[len(".text."):]: size // INSTRUCTION_BYTES
            for n, _kind, _off, size in _section_table(cubin) if n.startswith(".text.")}


def compile_cubin(source: Path, include: "Path | Sequence[Path | str]",
                  flags: Sequence[str], out: Path) -> bytes:
    """nvcc -cubin with the JIT's flags (less -lineinfo: its table is not code)."""
    keep = [f for f in flags if f != "-lineinfo"]
    dirs = [include] if isinstance(include, (str, Path)) else list(include)
    inc = [x for d in dirs for x in ("-I", str(d))]
    r = subprocess.run(["nvcc", *keep, *inc, "-cubin", "-o", str(out), str(source)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"nvcc failed on {source}:\n{r.stderr}")
    return out.read_bytes()
