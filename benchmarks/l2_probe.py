"""How much of the split kernel's time is K's DRAM latency (GPU only).

    python benchmarks/l2_probe.py [POOL_PAGES [B S_Q SK H_Q]...]

For a few bench-of-record rows: the eager median of the anchor's workload, then of the same
call with every block-table entry folded into the first POOL_PAGES pages (default 256 pages
of 64 tokens: 18 MiB of K, resident in the 50 MiB L2), output checked against the reference
in both.  Same kernel, same work, same grid: the ratio is what K's trip from DRAM costs.
"""
from __future__ import annotations

import sys

ROWS = [(128, 1, 8192, 128), (128, 1, 8192, 64), (128, 2, 8192, 64), (128, 1, 8192, 32),
        (128, 1, 8192, 16), (32, 1, 1024, 128)]


def main() -> None:
    from mlagen.backends.hopper import bench

    args = [int(x) for x in sys.argv[1:]]
    if len(args) > 1 and (len(args) - 1) % 4:
        print("usage: l2_probe.py [POOL_PAGES [B S_Q SK H_Q]...]", file=sys.stderr)
        sys.exit(2)
    pool = args[0] if args else 256
    rows = [tuple(args[i:i + 4]) for i in range(1, len(args), 4)] or ROWS
    print("| b s_q sk h_q | variant | DRAM ms | L2 ms | DRAM/L2 | checks |")
    print("|---|---|---|---|---|---|")
    for b, s_q, sk, h_q in rows:
        c = bench.Caller(b, s_q, sk, h_q, False)
        c1, _, _ = bench.check_output(c)
        t_dram = bench.time_eager(c)
        c.bt = (c.bt % pool).contiguous()
        c2, _, _ = bench.check_output(c)
        t_l2 = bench.time_eager(c)
        print(f"| {b} {s_q} {sk} {h_q} | {c.variant} | {t_dram:.4f} | {t_l2:.4f} | "
              f"{t_dram / t_l2:.3f} | {c1}, {c2} |", flush=True)


if __name__ == "__main__":
    main()
