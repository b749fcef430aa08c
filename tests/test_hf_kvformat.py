"""8-bit latent caches in the transformers integration: PagedLatentCache(kv_format=...) writes
new tokens with mlagen.kvformat.write, decode steps run the fused operator on the 8-bit
pages (the SC11 emulator on CPU, flash_mla_with_kvcache(descale_k=) on a GPU), prefill
attends over the dequantized cache; greedy tokens against the bf16 cache.

Token equality is exact on the test model whose top logit leads by ~8 (hf_models.tiny_model).
On the README's model (random init, 1 layer) it cannot be: its logits are ~1 with top-2
margins down to one bf16 step (0.0078), and an e4m3 cache (3 mantissa bits: up to 2^-4
relative error a value) moves its logits by ~3% of max |logit|; so there the criterion is
the logits, teacher-forced on the bf16 cache's tokens (within 5% of max |logit| at every
step), and the tokens at all but one of the 16 steps."""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("transformers", minversion="5.0")

from hf_models import prompts, tiny_model  # noqa: E402
from mlagen import kvformat  # noqa: E402
from mlagen.backends.sc11.trace import Op  # noqa: E402
from mlagen.errors import InputError  # noqa: E402
from mlagen.integrations.transformers import (DESCALE_HEADROOM,  # noqa: E402
                                              PagedLatentCache, enable)

FORMATS = ("fp8_e4m3", "fp8_ds_mla")
PAGE = 16
NEW = 12


def _generate(model, ids, mask, cache, new=NEW):
    with torch.no_grad():
        return model.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False,
                              past_key_values=cache, output_logits=True,
                              return_dict_in_generate=True)


@pytest.fixture(scope="module")
def decisive():
    model = enable(tiny_model(), page_size=PAGE)
    ids, mask = prompts()
    return model, ids, mask, _generate(model, ids, mask, PagedLatentCache(model, 3, 64, PAGE))


@pytest.mark.parametrize("kv", FORMATS)
def test_generate_with_an_8bit_cache_gives_the_bf16_tokens(decisive, kv):
    model, ids, mask, want = decisive
    cache = PagedLatentCache(model, 3, 64, PAGE, kv_format=kv)
    got = _generate(model, ids, mask, cache)
    assert torch.equal(got.sequences, want.sequences)
    a, b = torch.stack(want.logits).float(), torch.stack(got.logits).float()
    assert ((a - b).abs().max() / a.abs().max()).item() <= 0.15   # measured 0.06 / 0.09
    # the pages are really 8-bit, in the format's width, and the decode ran the emulator on
    # them (its BDC dequantized)
    layer = cache.layers[0]
    fmt = kvformat.get(kv)
    assert layer.k_cache.dtype == kvformat.FP8 and layer.k_cache.shape[-1] == fmt.width()
    dec = model.model.layers[0].self_attn.decoder
    assert f"kv{kv.replace('_', '')}" in dec.impl.schedule_for(kv).variant_name()
    assert (dec.last.extra["trace"]["op"] == Op.DEQUANT).any()


def test_the_descale_is_chosen_at_the_prefill_and_kept(decisive):
    """fp8_e4m3: the layer's descale is DESCALE_HEADROOM x amax / 448 of the prompt's
    tokens, so the prompt's largest value is stored as exactly 448 / DESCALE_HEADROOM; decode
    steps keep it; slots no token holds stay NaN."""
    model, ids, mask, _ = decisive
    cache = PagedLatentCache(model, 3, 64, PAGE, kv_format="fp8_e4m3")
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask,
              position_ids=(mask.cumsum(-1) - 1).clamp(min=0), past_key_values=cache)
    layer = cache.layers[0]
    ds = layer.k_descale.clone()
    lens = layer.seqlens.tolist()
    stored = []
    for i, n in enumerate(lens):
        pages = cache.block_table[i, :-(-n // PAGE)].long()
        stored.append(layer.k_cache[pages].reshape(-1, 576)[:n].float())
    peak = torch.cat(stored).abs().max().item()
    assert peak == kvformat.E4M3_MAX / DESCALE_HEADROOM
    used = torch.zeros(layer.k_cache.shape[:2], dtype=torch.bool)
    for i, n in enumerate(lens):
        for t in range(n):
            used[cache.block_table[i, t // PAGE], t % PAGE] = True
    assert torch.isnan(layer.k_cache[~used].float()).all()
    _generate(model, ids, mask, cache, new=3)      # generate() resets and refills it
    assert layer.k_descale.item() == pytest.approx(ds.item())


def test_bad_formats_are_refused(decisive):
    model, ids, mask, _ = decisive
    with pytest.raises(InputError, match="not one of"):
        PagedLatentCache(model, 3, 64, PAGE, kv_format="fp4")
    with pytest.raises(InputError, match="per page"):
        PagedLatentCache(model, 3, 64, PAGE, kv_format="fp8_ue8m0_paged")
    with pytest.raises(InputError, match="model's dtype"):
        _generate(model, ids, mask, PagedLatentCache(model, 3, 64, PAGE, kv_format="fp16"),
                  new=1)


def _readme_model():
    """The README's model (tests/test_readme_hf.py runs that block)."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(0)
    config = DeepseekV3Config(
        vocab_size=256, hidden_size=256, intermediate_size=512, moe_intermediate_size=128,
        num_hidden_layers=1, num_attention_heads=8, num_key_value_heads=8, n_routed_experts=4,
        num_experts_per_tok=2, n_group=1, topk_group=1, kv_lora_rank=512, q_lora_rank=1536,
        qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
        rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=40,
                             original_max_position_embeddings=4096, beta_fast=32,
                             beta_slow=1, mscale=1.0, mscale_all_dim=1.0))
    return DeepseekV3ForCausalLM(config).to(torch.bfloat16).eval()


def _forced_logits(model, ids, mask, tokens, cache) -> torch.Tensor:
    """Each step's logits [b, steps, vocab] with the given tokens fed back (teacher forced)."""
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    out = []
    with torch.no_grad():
        r = model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache)
        out.append(r.logits[:, -1].float())
        for t in range(tokens.shape[1] - 1):
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
            pos = pos[:, -1:] + 1
            r = model(input_ids=tokens[:, t:t + 1], attention_mask=mask, position_ids=pos,
                      past_key_values=cache)
            out.append(r.logits[:, -1].float())
    return torch.stack(out, 1)


@pytest.mark.parametrize("kv", FORMATS)
def test_readme_model_8bit_cache_logits_teacher_forced(kv):
    model = enable(_readme_model(), page_size=PAGE)
    ids = torch.tensor([[5, 6, 7, 8, 9], [0, 0, 11, 12, 13]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
    ref = _generate(model, ids, mask, PagedLatentCache(model, 2, 64, PAGE), new=8)
    tokens = ref.sequences[:, ids.shape[1]:]
    want = torch.stack(ref.logits, 1).float()
    got = _forced_logits(model, ids, mask, tokens, PagedLatentCache(model, 2, 64, PAGE,
                                                                   kv_format=kv))
    bound = 0.05 * want.abs().max()                 # measured: 0.033 / 0.034
    diff = (got - want).abs().amax(-1)              # [b, steps]
    assert (diff <= bound).all(), diff
    # the tokens: the same at all but at most one of the 16 steps (measured: one, where the
    # bf16 cache's top-2 margin is 0.0078, one bf16 step, against a logit noise of 0.03)
    assert (got.argmax(-1) == tokens).float().mean() >= 14 / 16


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("kv", FORMATS)
def test_generate_with_an_8bit_cache_on_hopper(kv):
    """The Hopper path: flash_mla_with_kvcache on the 8-bit pages (fp8_e4m3 with descale_k);
    its 8-bit kernels take pages of multiples of 64."""
    page = 64
    model = enable(copy.deepcopy(tiny_model()).cuda(), target="hopper", page_size=page)
    ids, mask = (t.cuda() for t in prompts())
    want = _generate(model, ids, mask, PagedLatentCache(model, 3, 128, page))
    cache = PagedLatentCache(model, 3, 128, page, kv_format=kv)
    got = _generate(model, ids, mask, cache)
    assert cache.layers[0].k_cache.dtype == kvformat.FP8 and cache.layers[0].k_cache.is_cuda
    assert torch.equal(got.sequences, want.sequences)
    a, b = torch.stack(want.logits).float(), torch.stack(got.logits).float()
    err = ((a - b).abs().max() / a.abs().max()).item()
    print(f"hopper {kv}: relative logit error {err:.4f}")
    assert err <= 0.15
