"""mlagen inside a transformers DeepseekV4 model: its projections, compressor, indexer and
cache stay transformers'; mlagen's two-pool token-sparse operator (mlagen.reference's
sparse_attention, target "torch"; SC11's generated two-pool kernel for decode steps, the
default on CPU) attends to the sliding window (main pool) and the compressed entries
(extra pool: the CSA indexer's picks, the HCA causal ones) in one softmax with the layer's
sinks.  Greedy tokens equal transformers' eager attention; the logits within 3% of max
|logit| (measured 0.6%: eager rounds scores and its softmax to bf16, mlagen works in fp32).
Prompts of 5..12 tokens and 12 new ones against a window of 8, CSA every 4 tokens keeping 2,
HCA every 8: both pools select."""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("transformers", minversion="5.24")

from hf_models import prompts, tiny_v4_model  # noqa: E402
from mlagen.errors import InputError  # noqa: E402
from mlagen.integrations import transformers_pools as pools  # noqa: E402
from mlagen.integrations.transformers import PagedLatentCache, disable, enable  # noqa: E402

NEW = 12
LOGIT_RTOL = 0.03


def _generate(model, ids, mask, new=NEW):
    with torch.no_grad():
        return model.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False,
                              output_logits=True, return_dict_in_generate=True)


def _logit_error(a, b) -> float:
    la, lb = torch.stack(a.logits).float(), torch.stack(b.logits).float()
    return ((la - lb).abs().max() / la.abs().max()).item()


@pytest.fixture(scope="module")
def runs():
    model = tiny_v4_model()
    ids, mask = prompts()
    want = _generate(model, ids, mask)
    m = enable(copy.deepcopy(model), target="torch")
    return model, m, ids, mask, want


def test_pooled_generation_matches_eager(runs):
    model, m, ids, mask, want = runs
    got = _generate(m, ids, mask)
    assert all(isinstance(layer.self_attn, pools.PooledAttention) for layer in m.model.layers)
    assert torch.equal(got.sequences, want.sequences)
    assert _logit_error(want, got) <= LOGIT_RTOL
    # the last step: the window's 8 of 17..24 tokens; CSA: 2 of its 5 entries (its indexer
    # chose); HCA: its 2 causal entries; the sliding-only layer has no extra pool
    assert {layer.self_attn.last["path"] for layer in m.model.layers} == {"torch"}
    window, csa, hca = (layer.self_attn.last["pools"] for layer in m.model.layers)
    assert len(window) == 1 and len(csa) == len(hca) == 2
    for p in (window[0], csa[0], hca[0]):
        assert (p.indices >= 0).sum(-1).flatten().tolist() == [8, 8, 8]
    assert csa[1].k_cache.shape[0:2] == (3, 8)           # 5 entries, pages of 8
    assert (csa[1].indices >= 0).sum(-1).flatten().tolist() == [2, 2, 2]
    assert hca[1].k_cache.shape[0:2] == (3, 8)
    assert (hca[1].indices >= 0).sum(-1).flatten().tolist() == [2, 2, 2]
    assert (mask.sum(1) + NEW - 1 > 8).all()


# measured logit errors over the first FAULT_STEPS steps; the bound: 0.05
FAULTS = {"no_sink": 0.09, "no_extra_pool": 0.13, "window_off_by_one": 0.16,
          "compressed_bias_ignored": 0.12}
FAULT_STEPS = 4


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_pool_faults_are_caught(runs, fault, monkeypatch):
    """Each part of the one softmax shows in the logits: the sinks, the compressed pool, the
    window's visible columns, the compressed entries' causality and the CSA indexer's
    picks (measured: FAULTS)."""
    model, m, ids, mask, want = runs
    orig_attn, orig_pool = pools.reference.sparse_attention, pools._pool

    def attn(q, ps, **kw):
        if fault == "no_sink":
            kw["attn_sink"] = None
        if fault == "no_extra_pool":
            ps = ps[:1]
        return orig_attn(q, ps, **kw)

    def pool(keys, visible, kind, page):
        if fault == "window_off_by_one" and kind == "window":
            visible = torch.roll(visible, 1, dims=-1)
        if fault == "compressed_bias_ignored" and kind == "compressed":
            visible = torch.ones_like(visible)
        return orig_pool(keys, visible, kind, page)

    monkeypatch.setattr(pools.reference, "sparse_attention", attn)
    monkeypatch.setattr(pools, "_pool", pool)
    got = _generate(m, ids, mask, FAULT_STEPS)
    la = torch.stack(want.logits[:FAULT_STEPS]).float()
    assert ((la - torch.stack(got.logits).float()).abs().max() / la.abs().max()).item() > 0.05


def test_pooled_generation_on_sc11_matches_eager(runs):
    """The default target on CPU: decode steps through SC11's generated two-pool kernel
    (d_qk 512 = 448 + 64 RoPE, V the whole key, sinks; the window's topk the sliding window,
    the compressed pool's rounded up to 8), the prefill in torch."""
    model, _, ids, mask, want = runs
    m = enable(copy.deepcopy(model))
    got = _generate(m, ids, mask)
    assert {layer.self_attn.last["path"] for layer in m.model.layers} == {"schedule"}
    assert torch.equal(got.sequences, want.sequences)
    assert _logit_error(want, got) <= LOGIT_RTOL


def test_pooled_model_refusals(runs):
    model, m, ids, mask, _ = runs
    with pytest.raises(InputError, match="keeps transformers' own cache"):
        PagedLatentCache(m, 3, 64)
    with pytest.raises(InputError, match="runs on target 'torch'"):
        enable(copy.deepcopy(model), target="no-such-kind")
    back = disable(copy.deepcopy(m))
    assert not any(isinstance(x, pools.PooledAttention) for x in back.modules())


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_pooled_generation_on_hopper_matches_eager():
    """Decode steps through mlagen.flash_mla_with_kvcache with extra_k_cache (d_qk 512 = 448 +
    64 RoPE, V the whole key, the layer's sinks: Hopper's d_qk 512 sparse kernel), the
    prefill in torch on the GPU; tokens equal eager's on the GPU."""
    model = tiny_v4_model().cuda()
    ids, mask = (t.cuda() for t in prompts())
    want = _generate(model, ids, mask)
    m = enable(copy.deepcopy(model), target="hopper")
    got = _generate(m, ids, mask)
    assert {layer.self_attn.last["path"] for layer in m.model.layers} == {"kernel"}
    assert torch.equal(got.sequences, want.sequences)
    assert _logit_error(want, got) <= LOGIT_RTOL
