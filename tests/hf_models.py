"""Tiny random-weight DeepseekV3 models with DeepSeek-V3's real MLA dims, built in code (no
hub downloads), for the transformers integration tests."""

from __future__ import annotations

import torch

# DeepSeek-V3's config.json rope: theta 10000 with YaRN (factor 40 over 4096 positions).
DSV3_ROPE = dict(rope_type="yarn", rope_theta=10000.0, factor=40,
                 original_max_position_embeddings=4096, beta_fast=32, beta_slow=1, mscale=1.0,
                 mscale_all_dim=1.0)
VOCAB, HIDDEN, HEADS = 384, 256, 8


def tiny_config(interleave: bool = True, rope: dict | None = None, layers: int = 2):
    from transformers import DeepseekV3Config

    return DeepseekV3Config(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=512, moe_intermediate_size=128,
        num_hidden_layers=layers, first_k_dense_replace=1, num_attention_heads=HEADS,
        num_key_value_heads=HEADS, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
        n_group=1, topk_group=1,
        # the real MLA dims
        kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64, qk_nope_head_dim=128,
        v_head_dim=128, max_position_embeddings=163840,
        rope_parameters=dict(rope or DSV3_ROPE), rope_interleave=interleave,
        attn_implementation="eager", pad_token_id=0, bos_token_id=1, eos_token_id=2,
        tie_word_embeddings=False)


def tiny_model(interleave: bool = True, rope: dict | None = None, layers: int = 2,
               seed: int = 0, dtype=torch.bfloat16):
    """Random weights, shaped so that a test can demand identical greedy tokens: the LM head
    is a permutation of the (unit-scale) embeddings, so each step's top logit leads the
    next by ~8 (bf16 noise: ~0.2); q_b_proj and kv_b_proj are 4x transformers' init so that
    attention is sharp and carries much of the logits (without it they move by ~13)."""
    from transformers import DeepseekV3ForCausalLM

    torch.manual_seed(seed)
    model = DeepseekV3ForCausalLM(tiny_config(interleave, rope, layers)).eval()
    return _decisive(model, seed, "q_b_proj").to(dtype)


def _decisive_head(model, seed: int) -> torch.Generator:
    """The LM head a scaled permutation of the embeddings (greedy tokens far from ties); the
    generator, for the caller's further draws."""
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        emb = torch.randn(VOCAB, HIDDEN, generator=g)
        model.model.embed_tokens.weight.copy_(emb)
        model.lm_head.weight.copy_(emb[torch.randperm(VOCAB, generator=g)] * 0.1)
    return g


def _decisive(model, seed: int, q_up: str):
    """tiny_model's weights: the LM head a scaled permutation of the embeddings, the query
    up-projection (q_up) and kv_b_proj 4x their init."""
    _decisive_head(model, seed)
    with torch.no_grad():
        for layer in model.model.layers:
            getattr(layer.self_attn, q_up).weight.mul_(4)
            layer.self_attn.kv_b_proj.weight.mul_(4)
    return model


def prompts(batch: int = 3, longest: int = 12, seed: int = 0):
    """Left-padded prompts of different lengths (longest, longest - 5, longest - 2, ...)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (batch, longest), generator=g)
    mask = torch.ones_like(ids)
    for i, pad in enumerate([0, 5, 2, 7, 1, 4][:batch]):
        mask[i, :pad] = 0
    ids[mask == 0] = 0
    return ids, mask


def tp_generate(rank: int, world: int, interleave: bool, new_tokens: int, out_path: str,
                device: str = "cpu"):
    """One TP rank (or the whole model when alone): enable mlagen on this rank's heads
    (SC11 on CPU, Hopper on cuda:rank), generate greedily, and (rank 0) save the tokens and
    logits."""
    from mlagen.integrations.transformers import PagedLatentCache, enable

    torch.set_num_threads(1)
    dev = f"cuda:{rank}" if device == "cuda" else "cpu"
    model = enable(tiny_model(interleave=interleave).to(dev), page_size=16)
    ids, mask = (t.to(dev) for t in prompts())
    cache = PagedLatentCache(model, ids.shape[0], 64, page_size=16)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens,
                             do_sample=False, past_key_values=cache, output_logits=True,
                             return_dict_in_generate=True)
    attn = model.model.layers[0].self_attn
    if rank == 0:
        torch.save(dict(sequences=out.sequences.cpu(),
                        logits=torch.stack(out.logits).float().cpu(), heads=attn.heads,
                        card_heads=attn.decoder.heads, target=attn.decoder.target), out_path)


def tiny_v2_model(seed: int = 0, dtype=torch.bfloat16):
    """DeepseekV2 without q_lora (DeepSeek-V2-Lite's shape: q_proj straight from the hidden
    state), interleaved RoPE in place, shaped like tiny_model for decisive greedy steps."""
    from transformers import DeepseekV2Config, DeepseekV2ForCausalLM

    torch.manual_seed(seed)
    cfg = DeepseekV2Config(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=512, moe_intermediate_size=128,
        num_hidden_layers=2, first_k_dense_replace=1, num_attention_heads=HEADS,
        num_key_value_heads=HEADS, n_routed_experts=4, num_experts_per_tok=2,
        n_shared_experts=1, n_group=1, topk_group=1, kv_lora_rank=512, q_lora_rank=None,
        qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
        max_position_embeddings=163840, rope_parameters=dict(DSV3_ROPE),
        attn_implementation="eager", pad_token_id=0, bos_token_id=1, eos_token_id=2,
        tie_word_embeddings=False)
    return _decisive(DeepseekV2ForCausalLM(cfg).eval(), seed, "q_proj").to(dtype)


def tiny_v32_model(seed: int = 0, dtype=torch.bfloat16, topk: int = 8, layers: int = 2):
    """DeepseekV32 (MLA plus the Lightning Indexer) with the real MLA dims and a small
    index_topk, so that prompts of 12 tokens and more make the indexer choose; shaped like
    tiny_model for decisive greedy steps."""
    from transformers import DeepseekV32Config, DeepseekV32ForCausalLM

    torch.manual_seed(seed)
    cfg = DeepseekV32Config(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=512, moe_intermediate_size=128,
        num_hidden_layers=layers, first_k_dense_replace=1, num_attention_heads=HEADS,
        num_key_value_heads=HEADS, n_routed_experts=4, num_experts_per_tok=2,
        n_shared_experts=1, n_group=1, topk_group=1, kv_lora_rank=512, q_lora_rank=1536,
        qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
        index_topk=topk, index_head_dim=128, index_n_heads=4,
        max_position_embeddings=163840, rope_parameters=dict(DSV3_ROPE),
        attn_implementation="eager", pad_token_id=0, bos_token_id=1, eos_token_id=2,
        tie_word_embeddings=False)
    return _decisive(DeepseekV32ForCausalLM(cfg).eval(), seed, "q_b_proj").to(dtype)


def tiny_v4_model(seed: int = 0, dtype=torch.bfloat16, window: int = 8, topk: int = 2):
    """DeepseekV4 with its real attention dims (one shared KV head of 512 = 448 + 64 RoPE),
    one layer of each kind (sliding only, CSA every 4 tokens with an indexer keeping topk,
    HCA every 8), a window of 8 tokens, random sinks; decisive as tiny_model (the LM head a
    scaled permutation of the embeddings; kv_norm and the compressors' 4x so that attention
    is sharp and the compressed entries carry: q and kv are RMS-normed, so their projections'
    scale does not carry)."""
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

    torch.manual_seed(seed)
    cfg = DeepseekV4Config(
        vocab_size=VOCAB, hidden_size=HIDDEN, moe_intermediate_size=128, num_hidden_layers=3,
        layer_types=["sliding_attention", "compressed_sparse_attention",
                     "heavily_compressed_attention"],
        num_attention_heads=HEADS, head_dim=512, q_lora_rank=256, n_routed_experts=4,
        num_experts_per_tok=2, sliding_window=window,
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
        o_groups=2, o_lora_rank=64, index_n_heads=4, index_head_dim=64, index_topk=topk,
        hc_mult=2, hc_sinkhorn_iters=5, attn_implementation="eager", pad_token_id=0,
        bos_token_id=1, eos_token_id=2)
    model = DeepseekV4ForCausalLM(cfg).eval()
    g = _decisive_head(model, seed)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.kv_norm.weight.mul_(4)
            if layer.self_attn.compressor is not None:
                layer.self_attn.compressor.kv_norm.weight.mul_(4)
            layer.self_attn.sinks.copy_(torch.randn(HEADS, generator=g))
    return model.to(dtype)
