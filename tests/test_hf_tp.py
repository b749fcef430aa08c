"""Tensor parallel on torch.distributed (gloo, CPU): tp = 2 and tp = 4 ranks, each running
the SC11 fused operator on its heads (8 -> 4 or 2 per card) with the o_proj partial sums
all-reduced, give the tp = 1 tokens and logits."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers", minversion="5.0")

from hf_models import tp_generate  # noqa: E402
from mlagen.parallel import spawn  # noqa: E402

NEW = 8


@pytest.fixture(scope="module")
def tp1(tmp_path_factory):
    path = tmp_path_factory.mktemp("tp1") / "out.pt"
    tp_generate(0, 1, True, NEW, str(path))
    return torch.load(path)


@pytest.mark.parametrize("tp", [2, 4])
def test_tp_matches_tp1(tp, tp1, tmp_path):
    path = tmp_path / "out.pt"
    spawn(tp_generate, tp, args=(True, NEW, str(path)))
    got = torch.load(path)
    assert got["card_heads"] == 8 // tp and got["heads"] == (0, 8 // tp)
    assert tp1["card_heads"] == 8
    assert torch.equal(got["sequences"], tp1["sequences"])
    # the same per-head math; only the fp32 order of the o_proj sum differs (and any bf16
    # rounding that moves with it)
    err = (got["logits"] - tp1["logits"]).abs().max() / tp1["logits"].abs().max()
    assert err <= 1e-2
