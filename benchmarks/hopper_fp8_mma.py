"""fp8_e4m3 decode at b 128, s_q 1, s_k 8192, h_q 16 (a memory-bound row): the register
path's two modes, fp8_mma = "dequant" and "mma" (their example schedules), beside the API's
defaults for the fp8_e4m3 and the bf16 cache (the same seed's random cache, quantized for
the 8-bit rows); 50 back-to-back calls each between CUDA events, one process.

    python benchmarks/hopper_fp8_mma.py      (an sm_90 GPU)
"""
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))   # run from a checkout

from mlagen.backends.hopper import api  # noqa: E402
from mlagen.backends.hopper.bench import time_back_to_back  # noqa: E402
from mlagen.problem import make_inputs  # noqa: E402
from mlagen.schedule import load  # noqa: E402
from mlagen.schedule.records import Problem  # noqa: E402

B, SQ, SK, H = 128, 1, 8192, 16


def timed(inp, sched, reps=50):
    s_q, h_q = inp.q.shape[1], inp.q.shape[2]
    md, ns = api.get_mla_metadata(inp.cache_seqlens, s_q * h_q, 1, schedule=sched,
                                  kv_format=inp.kv if inp.kv != "bf16" else None)

    def call():
        return api.flash_mla_with_kvcache(inp.q, inp.k_cache, inp.block_table,
                                          inp.cache_seqlens, 512, md, ns,
                                          softmax_scale=inp.softmax_scale, causal=True,
                                          schedule=sched, descale_k=inp.k_descale)
    return time_back_to_back(call, reps, warmup=5)


rows = []
for kv, sched in (("", None), ("fp8_e4m3", None),
                  ("fp8_e4m3", load(ROOT / "schedules" / "hopper_fp8_e4m3_regs.toml")),
                  ("fp8_e4m3", load(ROOT / "schedules" / "hopper_fp8_e4m3_mma.toml"))):
    prob = Problem(page_size=64, dtype="bf16", max_s_q=SQ, kv_format=kv)
    inp = make_inputs(prob, B, [SK] * B, s_q=SQ, heads=H, seed=0, device="cuda",
                      nan_fill=False)
    name = (sched.name if sched else "api default") + f" [{kv or 'bf16'}]"
    rows.append((name, timed(inp, sched)))
print(f"\n{'schedule':60s} {'us':>8s}")
for name, us in rows:
    print(f"{name:60s} {us:8.1f}")
