"""mlagen inside a transformers DeepseekV3 model: greedy generation through the SC11 fused
operator (CPU) or the Hopper path (GPU) gives transformers' eager tokens, with DeepSeek-V3's
YaRN rope, rope_interleave true and false; the paged cache holds transformers' own latents."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

pytest.importorskip("transformers", minversion="5.0")

from hf_models import DSV3_ROPE, prompts, tiny_model  # noqa: E402
from mlagen.errors import InputError  # noqa: E402
from mlagen.integrations.transformers import (MlagenAttention, PagedLatentCache,  # noqa: E402
                                              disable, enable)

NEW_TOKENS = 16
PAGE = 16          # prompts of 12 + 16 new tokens cross a page boundary
# Logits: eager and mlagen round to bf16 at different points (eager: k = kv_b_proj(c_kv),
# scores, softmax weights and P @ V in bf16; mlagen: the absorbed q and o_lat, as the card
# stores them).  Measured through 2 layers: <= 1.3% of max |logit|; allowed: 3%.
LOGIT_RTOL = 0.03


def _generate(model, ids, mask, cache=None, new=NEW_TOKENS):
    with torch.no_grad():
        return model.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False,
                              past_key_values=cache, output_logits=True,
                              return_dict_in_generate=True)


def _logit_error(a, b) -> float:
    """max |difference| of every step's logits over max |logit| (the relative bf16 error)."""
    la, lb = torch.stack(a.logits).float(), torch.stack(b.logits).float()
    return ((la - lb).abs().max() / la.abs().max()).item()


def _mlagen(model, device="cpu", target=None):
    m = enable(copy.deepcopy(model), target=target, page_size=PAGE)
    return m, PagedLatentCache(m, 3, 64, page_size=PAGE)


@pytest.fixture(scope="module", params=[True, False], ids=["interleave", "no-interleave"])
def eager_run(request):
    model = tiny_model(interleave=request.param)
    ids, mask = prompts()
    return model, ids, mask, _generate(model, ids, mask)


def test_greedy_generation_matches_eager(eager_run):
    model, ids, mask, want = eager_run
    m, cache = _mlagen(model)
    assert all(isinstance(layer.self_attn, MlagenAttention) for layer in m.model.layers)
    got = _generate(m, ids, mask, cache)
    assert got.sequences.shape[1] == ids.shape[1] + NEW_TOKENS
    assert torch.equal(got.sequences, want.sequences)
    assert _logit_error(want, got) <= LOGIT_RTOL
    # the decode steps ran the generated SC11 kernel (the prefill ran the torch operator)
    dec = m.model.layers[0].self_attn.decoder
    assert dec.target == "sc11" and dec.last is not None and len(dec.last.extra["trace"])
    layer = cache.layers[0]
    assert layer.seqlens.tolist() == (mask.sum(1) + NEW_TOKENS - 1).tolist()


def test_rope_and_scale_faults_are_caught(eager_run):
    """The logit check sees a rope the model does not use: the softmax scale without YaRN's
    mscale**2, and the rope dims paired in the wrong layout."""
    model, ids, mask, want = eager_run
    for fault in ("no_mscale", "layout"):
        m, cache = _mlagen(model)
        for layer in m.model.layers:
            a = layer.self_attn
            if fault == "no_mscale":
                a.decoder.softmax_scale = 192 ** -0.5
            else:
                other = "interleaved" if a.rope.layout == "half" else "half"
                a.decoder.weights = dataclasses.replace(
                    a.decoder.weights, rope=dataclasses.replace(a.rope, layout=other))
        got = _generate(m, ids, mask, cache, new=3)
        short = dataclasses.replace(want, logits=want.logits[:3])
        assert _logit_error(short, got) > LOGIT_RTOL, fault


def test_paged_cache_holds_transformers_latents(eager_run):
    """After the prompt, each layer's paged cache holds the c_kv and k_rot transformers caches
    (k_rot de-interleaved when rope_interleave), token by token through the block table."""
    from transformers import DynamicCache

    model, ids, mask, _ = eager_run
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    dc = DynamicCache(config=model.config)
    with torch.no_grad():
        model(ids, attention_mask=mask, position_ids=pos, past_key_values=dc)
    m, cache = _mlagen(model)
    with torch.no_grad():
        m(ids, attention_mask=mask, position_ids=pos, past_key_values=cache)
    for li, layer in enumerate(cache.layers):
        kv_nope, k_rot = dc.layers[li].keys, dc.layers[li].values      # [b, 1, s, .]
        for i in range(ids.shape[0]):
            n = int(mask[i].sum())
            t = torch.arange(n)
            mine = layer.k_cache[cache.block_table[i, t // PAGE].long(), t % PAGE, 0].float()
            theirs = torch.cat([kv_nope[i, 0, -n:], k_rot[i, 0, -n:]], -1).float()
            if li == 0:      # same input: c_kv bit for bit
                assert torch.equal(mine[:, :512], theirs[:, :512])
            # k_rot: transformers rotates in bf16 with bf16 cos/sin, mlagen in fp32; later
            # layers' inputs carry the first attention's bf16 differences
            for cols in (slice(0, 512), slice(512, 576)):
                err = (mine[:, cols] - theirs[:, cols]).abs().max().item()
                assert err <= 0.03 * theirs[:, cols].abs().max().item()
            assert torch.isnan(layer.k_cache[cache.block_table[i, (n - 1) // PAGE].long(),
                                             (n - 1) % PAGE + 1:]).all()


def test_refusals():
    model = tiny_model(layers=1)
    m = enable(copy.deepcopy(model), page_size=PAGE)
    ids, mask = prompts(2)
    with pytest.raises(InputError, match="PagedLatentCache"):
        m(ids, attention_mask=mask)
    with pytest.raises(InputError, match="batch 2 differs"):
        m(ids, attention_mask=mask, past_key_values=PagedLatentCache(m, 3, 64, PAGE))
    with pytest.raises(InputError, match="max_length"):
        m(ids, attention_mask=mask, past_key_values=PagedLatentCache(m, 2, 8, PAGE))
    with pytest.raises(InputError, match="deepseek_v3"):
        enable(torch.nn.Linear(2, 2))
    assert not any(isinstance(x, MlagenAttention) for x in disable(m).modules())


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("interleave", [True, False])
def test_greedy_generation_matches_eager_on_hopper(interleave):
    """The Hopper path: absorption and RoPE in torch around mlagen.flash_mla_with_kvcache."""
    model = tiny_model(interleave=interleave).cuda()
    ids, mask = (t.cuda() for t in prompts())
    want = _generate(model, ids, mask)
    m, cache = _mlagen(model, target="hopper")
    assert m.model.layers[0].self_attn.decoder.target == "hopper"
    got = _generate(m, ids, mask, cache)
    assert torch.equal(got.sequences, want.sequences)
    err = _logit_error(want, got)
    print(f"hopper interleave={interleave}: relative logit error {err:.4f}")
    assert err <= LOGIT_RTOL


def test_deepseek_v3_rope_is_used():
    """The model's config carries DeepSeek-V3's YaRN; the layers scale the softmax by its
    mscale**2 (1.874) and rotate with its frequencies."""
    model = tiny_model(layers=1)
    a = enable(copy.deepcopy(model)).model.layers[0].self_attn
    assert a.rope.kind == "yarn" and a.rope.factor == DSV3_ROPE["factor"]
    assert a.softmax_scale == pytest.approx(model.model.layers[0].self_attn.scaling, rel=1e-12)


def test_deepseek_v2_without_q_lora():
    """DeepseekV2 with q_lora_rank None: W_UQ is q_proj (the operator's q_lora is the hidden
    state itself); its RoPE rotates interleaved pairs in place."""
    from hf_models import tiny_v2_model

    model = tiny_v2_model()
    ids, mask = prompts()
    want = _generate(model, ids, mask, new=8)
    m, cache = _mlagen(model)
    a = m.model.layers[0].self_attn
    assert a.decoder.weights.w_uq.shape[0] == model.config.hidden_size
    assert a.rope.layout == "interleaved"
    got = _generate(m, ids, mask, cache, new=8)
    assert torch.equal(got.sequences, want.sequences)
    assert _logit_error(want, got) <= LOGIT_RTOL
