"""Calling a kernel runner with poisoned outputs.

Every element of out and lse is NaN before the kernel runs, so an element the kernel never
writes (or reads before writing) stays NaN, and the NaN-position check in compare.py fails
on it: the reference never produces NaN.

Interface with the backends: a runner that accepts ``out=MlaOutputs`` writes into those
tensors (and may return them or None).  A runner without that keyword allocates its own
outputs, which the verifier cannot poison; the result then says so (``poisoned=False``).
"""

from __future__ import annotations

import inspect
from typing import Callable

import torch

from ..problem import MlaInputs, MlaOutputs


def accepts(fn: Callable, keyword: str) -> bool:
    """Whether a runner takes a keyword argument (an explicit ``accepts_<keyword>``
    attribute on the runner wins over its signature)."""
    flag = getattr(fn, f"accepts_{keyword}", None)
    if flag is not None:
        return bool(flag)
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return keyword in params


def accepts_out(fn: Callable) -> bool:
    return accepts(fn, "out")


def poisoned_like(inputs: MlaInputs, out_shape, lse_shape, device=None) -> MlaOutputs:
    """NaN-filled outputs: out in the inputs' dtype, lse in fp32."""
    src = inputs.q if inputs.q is not None else inputs.q_lora
    device = device if device is not None else src.device
    return MlaOutputs(out=torch.full(tuple(out_shape), float("nan"), dtype=src.dtype,
                                     device=device),
                      lse=torch.full(tuple(lse_shape), float("nan"), dtype=torch.float32,
                                     device=device))


def call_poisoned(fn: Callable, inputs: MlaInputs, out_shape, lse_shape, **kw
                  ) -> tuple[MlaOutputs, bool]:
    """Run `fn` on `inputs` (with extra keywords `kw`) into poisoned outputs when it lets
    us.  Returns the outputs and whether they were poisoned (False: the runner allocated its
    own, or ignored ``out=``)."""
    if not accepts_out(fn):
        return fn(inputs, **kw), False
    poison = poisoned_like(inputs, out_shape, lse_shape)
    result = fn(inputs, out=poison, **kw)
    if result is None:
        return poison, True
    same = (result.out is not None and result.out.data_ptr() == poison.out.data_ptr()
            and result.lse is not None and result.lse.data_ptr() == poison.lse.data_ptr())
    return result, same
