"""mlagen inside a transformers DeepseekV32 model (DeepSeek-V3.2's DSA): the model's Lightning
Indexer (in torch) picks each query's top-k columns, mlagen attends to those keys of the
paged latent cache (bf16 or fp8_ds_mla pages) with the token-sparse operator (target "torch",
and SC11's generated sparse kernel for decode steps, the default on CPU); greedy tokens
equal transformers' eager attention.  index_topk is 8 and the prompts 5..12 tokens (plus 12
new), so the indexer chooses at most steps and the short rows see all their tokens early.

The criterion.  Layer 0's indexer reads the same hidden states in both runs, so its picks are
identical; a later layer's indexer reads states that differ by the bf16 rounding of the
layers before, and where two columns' index scores are that close the picks differ (measured:
layer 1 at 2 of 8 decode steps, logits then off by ~10%).  So: tokens equal at every step;
the logits within LOGIT_RTOL at every step where every layer picked the same columns (and
on the 1-layer model at every step).  FP8 pages: tokens equal, logits against the bf16 cache's
within 15% of max |logit| (the 8-bit HF tests' bound; measured 2.6%)."""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("transformers", minversion="5.24")

from hf_models import prompts, tiny_v32_model  # noqa: E402
import mlagen.integrations.transformers as hf  # noqa: E402
from mlagen import kvformat, reference  # noqa: E402
from mlagen.problem import SparsePool  # noqa: E402
from mlagen.errors import InputError  # noqa: E402
from mlagen.integrations.sparse import compact, visible_slots  # noqa: E402
from mlagen.integrations.transformers import PagedLatentCache, enable  # noqa: E402

from transformers.models.deepseek_v32 import modeling_deepseek_v32 as v32  # noqa: E402

PAGE, NEW, TOPK = 16, 12, 8
LOGIT_RTOL = 0.03      # measured <= 1.0% at the steps whose picks agree


def _logit_errors(a, b) -> list[float]:
    la, lb = torch.stack(a.logits).float(), torch.stack(b.logits).float()
    scale = la.abs().max()
    return [((la[i] - lb[i]).abs().max() / scale).item() for i in range(la.shape[0])]


def _generate(model, ids, mask, cache=None, new=NEW):
    """Greedy generation, and the indexer's picks [(layer, [b, s, k])] in call order."""
    picks = []
    orig = v32.DeepseekV32Indexer.forward

    def spy(self, *args, **kwargs):
        cols = orig(self, *args, **kwargs)
        picks.append((self.layer_idx, cols.clone()))
        return cols

    with pytest.MonkeyPatch.context() as mp, torch.no_grad():
        mp.setattr(v32.DeepseekV32Indexer, "forward", spy)
        out = model.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False,
                             past_key_values=cache, output_logits=True,
                             return_dict_in_generate=True)
    return out, picks


def _agreeing_steps(pa, pb, layers: int) -> list[bool]:
    """Per generate step: did every layer pick the same column set in both runs?"""
    same = [torch.equal(a.sort(-1).values, b.sort(-1).values) for (_, a), (_, b) in zip(pa, pb)]
    return [all(same[i:i + layers]) for i in range(0, len(same), layers)]


@pytest.fixture(scope="module")
def eager():
    model = tiny_v32_model(topk=TOPK)
    ids, mask = prompts()
    return model, ids, mask, _generate(model, ids, mask)


@pytest.fixture(scope="module")
def switched(eager):
    return enable(copy.deepcopy(eager[0]), target="torch", page_size=PAGE)


@pytest.mark.parametrize("kv", [None, "fp8_ds_mla"], ids=["bf16", "fp8_ds_mla"])
def test_sparse_generation_matches_eager(eager, switched, kv):
    model, ids, mask, (want, want_picks) = eager
    cache = PagedLatentCache(switched, 3, 64, page_size=PAGE, kv_format=kv)
    got, got_picks = _generate(switched, ids, mask, cache)
    assert torch.equal(got.sequences, want.sequences)
    layers = model.config.num_hidden_layers
    assert len(got_picks) == len(want_picks) == layers * NEW
    # layer 0 reads identical hidden states: identical picks at every step
    for (la, a), (_, b) in zip(want_picks, got_picks):
        if la == 0:
            assert torch.equal(a, b)
    attn = switched.model.layers[0].self_attn
    assert attn.decoder.target == "torch" and attn.decoder.last["path"] == "torch"
    layer = cache.layers[0]
    lens = (mask.sum(1) + NEW - 1)
    assert layer.seqlens.tolist() == lens.tolist()
    # the last step attended to topk of its 16..23 tokens: sparsity chose
    valid = (attn.decoder.last["indices"] >= 0).sum(-1).squeeze(1)
    assert valid.tolist() == [TOPK] * 3 and bool((lens > TOPK).all())
    if kv is None:
        agree = _agreeing_steps(want_picks, got_picks, layers)
        assert sum(agree) >= NEW // 2
        errors = _logit_errors(want, got)
        assert max(e for e, ok in zip(errors, agree) if ok) <= LOGIT_RTOL
    else:
        assert layer.k_cache.dtype == kvformat.FP8
        assert layer.k_cache.shape[-1] == kvformat.get(kv).width()


@pytest.fixture(scope="module")
def one_layer():
    model = tiny_v32_model(topk=TOPK, layers=1)
    ids, mask = prompts()
    want, _ = _generate(model, ids, mask)
    return enable(copy.deepcopy(model), target="torch", page_size=PAGE), ids, mask, want


@pytest.mark.parametrize("kv", [None, "fp8_ds_mla"], ids=["bf16", "fp8_ds_mla"])
def test_sparse_generation_on_sc11_matches_eager(eager, kv):
    """The default target on CPU: decode steps through SC11's generated sparse kernel (a
    schedule of attention = "sparse", topk = index_topk, the cache's page size and format),
    the prefill through the torch operator."""
    model, ids, mask, (want, want_picks) = eager
    m = enable(copy.deepcopy(model), page_size=PAGE)
    dec = m.model.layers[0].self_attn.decoder
    assert dec.target == "sc11"
    got, got_picks = _generate(m, ids, mask, PagedLatentCache(m, 3, 64, PAGE, kv_format=kv))
    assert dec.last["path"] == "schedule"
    assert torch.equal(got.sequences, want.sequences)
    if kv is None:
        agree = _agreeing_steps(want_picks, got_picks, model.config.num_hidden_layers)
        errors = _logit_errors(want, got)
        assert max(e for e, ok in zip(errors, agree) if ok) <= LOGIT_RTOL


def test_one_layer_logits_match_eager_bf16_and_fp8(one_layer):
    """fp8_ds_mla (V3.2's serving format) and fp8_e4m3 (one descale a layer) pages."""
    m, ids, mask, want = one_layer
    bf16, _ = _generate(m, ids, mask, PagedLatentCache(m, 3, 64, page_size=PAGE))
    assert torch.equal(bf16.sequences, want.sequences)
    assert max(_logit_errors(want, bf16)) <= LOGIT_RTOL              # measured 0.6%
    for kv in ("fp8_ds_mla", "fp8_e4m3"):
        fp8, _ = _generate(m, ids, mask, PagedLatentCache(m, 3, 64, PAGE, kv_format=kv))
        assert torch.equal(fp8.sequences, want.sequences)
        assert max(_logit_errors(bf16, fp8)) <= 0.15                 # measured 2.6%, 2.7%


def test_selection_faults_are_caught(eager, switched, one_layer, monkeypatch):
    """The logits see keys other than the indexer's: its picks one column early (1 layer;
    measured 32%), and picks the mask hides counted (a later prompt token, a pad: 2 layers,
    the prefill's rows feed layer 1; measured 11..23%)."""
    m, ids, mask, want = one_layer
    orig = hf.visible_slots
    monkeypatch.setattr(hf, "visible_slots",
                        lambda c, v, *a: orig((c.long() - 1).clamp(min=0), v, *a))
    got, _ = _generate(m, ids, mask, PagedLatentCache(m, 3, 64, page_size=PAGE))
    assert max(_logit_errors(want, got)) > 0.1
    model, ids, mask, (want, _) = eager
    monkeypatch.setattr(hf, "visible_slots", lambda c, v, *a: orig(c, torch.ones_like(v), *a))
    got, _ = _generate(switched, ids, mask, PagedLatentCache(switched, 3, 64, page_size=PAGE))
    assert _logit_errors(want, got)[0] > 0.1


@pytest.mark.parametrize("kv", [None, "fp8_ds_mla"], ids=["bf16", "fp8_ds_mla"])
def test_the_kernel_call_gets_flashmla_arguments(one_layer, kv):
    """The decode steps' call of a target with FlashMLA's sparse API, stood in for by a
    function that checks FlashMLA 9241ae3's contract (q bf16 [b, 1, h, 576], head_dim_v 512,
    int32 indices with topk a multiple of 64, is_fp8_kvcache as the pages are, a fresh
    get_mla_metadata()) and answers with the sparse reference: the tokens stay eager's."""
    m, ids, mask, want = one_layer
    calls = []

    def meta():
        return {"fresh": True}, None

    def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, sched,
                               num_splits=None, softmax_scale=None, causal=False,
                               is_fp8_kvcache=False, indices=None, **rest):
        assert q.dtype == torch.bfloat16 and q.shape[1:] == (1, 8, 576)
        assert head_dim_v == 512 and sched == {"fresh": True} and not causal
        assert indices.dtype == torch.int32 and indices.shape[-1] % 64 == 0
        assert is_fp8_kvcache == (kv is not None) and not rest
        calls.append(int((indices >= 0).sum(-1).max()))
        pool = SparsePool(k_cache, indices, kv_format=kv)
        out, lse = reference.sparse_attention(q.float(), [pool], dv=head_dim_v,
                                              softmax_scale=softmax_scale)
        return out.to(q.dtype), lse

    dec = m.model.layers[0].self_attn.decoder
    try:
        dec.call = (flash_mla_with_kvcache, meta)
        got, _ = _generate(m, ids, mask, PagedLatentCache(m, 3, 64, PAGE, kv_format=kv))
    finally:
        dec.call = None
    assert dec.last["path"] == "kernel" and len(calls) == NEW - 1 and max(calls) == TOPK
    assert torch.equal(got.sequences, want.sequences)
    if kv is None:
        assert max(_logit_errors(want, got)) <= LOGIT_RTOL


def test_a_sparse_step_without_the_mask_is_refused(switched):
    attn = switched.model.layers[0].self_attn
    with pytest.raises(InputError, match="4-D attention mask"):
        attn._selected(None, None, None, None, None, None, None, None, None)


def test_visible_slots_and_compact():
    """Columns count each row's pads first; hidden or pad columns give -1; compact moves the
    valid entries first and trims topk to the longest row (rounded up)."""
    table = torch.tensor([[2, 0], [1, 3]], dtype=torch.int32)
    lens = torch.tensor([5, 3], dtype=torch.int32)
    cols = torch.tensor([[[4, 0, 2]], [[4, 1, 3]]], dtype=torch.int32)    # 5 columns each
    visible = torch.tensor([[[True, True, False]], [[True, True, True]]])
    slots = visible_slots(cols, visible, table, 4, lens, 5)
    # row 0: column 4 = position 4 (page 1 -> block 0, offset 0); column 0 = position 0
    # (block 2); column 2 hidden.  row 1 (2 pads): columns 4, 3 = positions 2, 1 (block 1);
    # column 1 is a pad
    assert slots.tolist() == [[[0, 8, -1]], [[6, -1, 5]]]
    packed, count = compact(slots, multiple=4)
    assert packed.tolist() == [[[0, 8, -1, -1]], [[6, 5, -1, -1]]]
    assert count.tolist() == [[2], [2]]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("kv", [None, "fp8_ds_mla"], ids=["bf16", "fp8_ds_mla"])
def test_sparse_generation_on_the_gpu_matches_eager(kv):
    """Decode steps through mlagen.flash_mla_with_kvcache(..., indices=) (FlashMLA's sparse
    call), the prefill through the torch operator on the
    GPU; tokens equal eager's."""
    model = tiny_v32_model(topk=TOPK).cuda()
    ids, mask = (t.cuda() for t in prompts())
    want, _ = _generate(model, ids, mask)
    m = enable(copy.deepcopy(model), target="hopper", page_size=PAGE)
    cache = PagedLatentCache(m, 3, 64, page_size=PAGE, kv_format=kv)
    got, _ = _generate(m, ids, mask, cache)
    assert m.model.layers[0].self_attn.decoder.last["path"] == "kernel"
    assert torch.equal(got.sequences, want.sequences)
    assert cache.layers[0].k_cache.is_cuda
