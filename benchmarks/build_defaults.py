"""Build the API's default Hopper variants in parallel and print each one's cold build
seconds (the visits' first step; GPU machine).  --page16: also the 16-token-page defaults
(the mma_sync kernel).

    PYTHONPATH=$PWD python benchmarks/build_defaults.py [--page16]
"""
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from mlagen.backends.hopper import defaults, render
from mlagen.jit import build

s = [defaults.default_schedule(r, d) for r in (16, 32, 64) for d in ("bf16", "fp16")]
if "--page16" in sys.argv[1:]:
    s += [defaults.default_schedule(r, "bf16", page_size=16) for r in (16, 32, 64)]
t = time.time()
with ThreadPoolExecutor(12) as ex:
    for a in ex.map(lambda x: build(render(x)), {x.variant_name(): x for x in s}.values()):
        print(a.path, round(a.seconds, 1))
print("built in", round(time.time() - t, 1), "s")
