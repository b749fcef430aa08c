"""FlashMLA on an mlagen bench Caller's tensors, for compare.py (GPU only).  The loader and
the call are mlagen/backends/hopper/flashmla_live.py, which `mlagen bench --flashmla LIB`
uses too; here the library comes from $FM_LIB.
"""

from __future__ import annotations

import os

from mlagen.backends.hopper.flashmla_live import FlashMLACall, load


def FlashMLACaller(c):  # noqa: N802 (reads as the class it returns)
    return FlashMLACall(load(os.environ.get("FM_LIB", "libflashmla.so")), c)
