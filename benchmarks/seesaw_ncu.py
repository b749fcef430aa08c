"""One row of the anchor (b=128, s_q=1, s_k=8192, h_q=128) through the wgmma kernel of the
tree on PYTHONPATH, three calls: the case that ncu profiles (seesaw_visit2.sh)."""
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from seesaw_ab import WGMMA, call, workload  # noqa: E402

row = tuple(int(x) for x in os.environ.get("SEESAW_ROW", "128,1,8192,128").split(","))
f = call(*workload(*row)[:4], WGMMA)
for _ in range(3):
    f()
torch.cuda.synchronize()
print("ok", row)
