"""The transformers integration on two GPUs: greedy generation on the Hopper path on GPU 0
(tp = 1), then tp = 2 over NCCL (one H200 a rank), compared with each other (the
figure in BENCHMARKS.md's "DeepSeek-V3 in transformers").

    PYTHONPATH=$PWD:tests python3 benchmarks/hf_generate_gpu.py OUTDIR

The eager-vs-mlagen test itself is tests/test_hf_integration.py -m cuda."""

from __future__ import annotations

import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

from hf_models import tp_generate  # noqa: E402
from mlagen.parallel import spawn  # noqa: E402


def main(out: str) -> int:
    new = 16
    t = time.perf_counter()
    tp_generate(0, 1, True, new, f"{out}/tp1.pt", device="cuda")
    t1 = time.perf_counter() - t
    t = time.perf_counter()
    spawn(tp_generate, 2, args=(True, new, f"{out}/tp2.pt", "cuda"), device="cuda")
    t2 = time.perf_counter() - t
    a, b = torch.load(f"{out}/tp1.pt"), torch.load(f"{out}/tp2.pt")
    same = torch.equal(a["sequences"], b["sequences"])
    err = ((a["logits"] - b["logits"]).abs().max() / a["logits"].abs().max()).item()
    print(f"| run | target | heads a rank | wall s (incl. start-up, builds) |")
    print(f"|---|---|---|---|")
    print(f"| tp=1, cuda:0 | {a['target']} | {a['card_heads']} | {t1:.1f} |")
    print(f"| tp=2, NCCL, cuda:0-1 | {b['target']} | {b['card_heads']} | {t2:.1f} |")
    print(f"tp=2 tokens == tp=1 tokens: {same}; max |logit diff| / max |logit| = {err:.2e}")
    return 0 if same and err <= 1e-2 else 1


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python3 benchmarks/hf_generate_gpu.py OUTDIR")
    sys.exit(main(sys.argv[1]))
