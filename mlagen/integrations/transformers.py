"""Run a transformers DeepseekV3 (or DeepseekV2, DeepseekV32, DeepseekV4) model's attention
through mlagen.

    from mlagen.integrations.transformers import enable, PagedLatentCache
    enable(model)                                   # the target kind of the model's device
    cache = PagedLatentCache(model, batch_size=4, max_length=256, page_size=64)
    out = model.generate(ids, attention_mask=mask, past_key_values=cache, max_new_tokens=32)
    fp8 = PagedLatentCache(model, 4, 256, page_size=64, kv_format="fp8_e4m3")   # 8-bit cache

`enable` replaces every layer's self_attn by an `MlagenAttention` that keeps the layer's own
projections and prepares, once, the absorbed weights of its heads: W_UQ from q_b_proj (or
q_proj when q_lora_rank is None, DeepseekV2-Lite), W_UK and W_UV from kv_b_proj.  Each step:

    q_lora = q_a_layernorm(q_a_proj(x))             (x itself without q_lora)
    (c_kv | k_rope) = kv_a_layernorm / RoPE of kv_a_proj_with_mqa(x) -> the paged latent cache
    out[b, s, h] = the fused operator (mlagen.integrations.latent) on the cache
    o_proj: this rank's heads' columns, fp32 partial sums all-reduced over the TP ranks

Decode steps (s_q <= the kernel's rows) run the generated kernel; longer steps (a prefill)
run mlagen's torch operator on the same cache.  RoPE is mlagen.rope from the model's config
(default / linear / YaRN with its mscale and softmax scale).  With rope_interleave (DeepSeek-V3's
configs) transformers de-interleaves the rope dims as it rotates, so its cached k_rot is in
the half layout; the paged cache keeps that layout (W_UQ's rope columns and k_rope are
permuted once, the kernel rotates halves), so its latents equal transformers' own.

8-bit caches (``kv_format`` "fp8_e4m3" or "fp8_ds_mla", mlagen/kvformat.py): new tokens
are quantized into the pages in place by mlagen.kvformat.write (vLLM's concat_and_cache_mla).
fp8_e4m3's descale is one per layer, chosen by the cache at the layer's first write (the
prompt's prefill) as ``DESCALE_HEADROOM x amax / 448`` of the real tokens written then, and
kept: later tokens up to twice that amplitude are stored unsaturated, larger ones saturate at
+-448 x descale (e4m3 is floating point, so the headroom costs precision only below 2^-6 x
the descale).  fp8_ds_mla scales every 128 latent values of each token by itself.  Decode
steps hand the 8-bit cache and its descale to the kernel (the emulated card dequantizes in
its BDC; on a GPU flash_mla_with_kvcache(..., descale_k=)); prefill attends over the
dequantized cache.

Sequences: left padding (generate's default for decoder-only models) with position_ids from
the attention mask; a row's real tokens are its last position_ids[-1] + 1 - cached ones.
Beam search (cache reordering) is not supported.

DeepseekV32 (DeepSeek-V3.2's DSA): the same absorbed weights and paged latent cache (bf16 or
fp8_ds_mla, the format V3.2 serves); the layer's Lightning Indexer stays the model's module,
in torch: it scores every key column (its keys in the cache's indexer_keys, pads included, as
transformers keeps them) against the model's mask and returns top-k columns, all of them
when the query sees fewer than index_topk.  transformers' eager attention attends to the
picked columns its mask keeps (causal within the step, no pads), so mlagen does the same:
mlagen.integrations.sparse.visible_slots turns each picked column the mask shows into its
cache slot (page * page_size + offset, -1 otherwise) and SparseLatentDecoder attends there
(decode steps: a target with FlashMLA's sparse call, flash_mla_with_kvcache(..., indices=),
through it; a target that generates sparse kernels from schedules (the emulated card on CPU) through a
schedule of attention = "sparse", topk = index_topk and the cache's page size and format;
prefill, fp8_e4m3 pages and target "torch": mlagen.reference.sparse_attention).

DeepseekV4 (a window and compressed pools, one shared 512-wide KV head, sinks):
mlagen.integrations.transformers_pools.PooledAttention; enable() switches it, generate()
keeps transformers' own cache (no PagedLatentCache).
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from .. import kvformat
from ..errors import InputError
from ..parallel import all_reduce_sum, head_range, world
from ..problem import FusedWeights
from ..rope import RopeConfig, deinterleave_perm, rotate
from .latent import LatentDecoder, default_target
from .sparse import SparseLatentDecoder, sparse_schedules, visible_slots
from .transformers_pools import PooledAttention

try:
    from transformers.cache_utils import Cache, CacheLayerMixin
except ImportError as e:  # pragma: no cover - the extra is missing
    raise ImportError('mlagen.integrations.transformers needs transformers 5.x: '
                      'pip install "mlagen[hf]"') from e

__all__ = ["enable", "disable", "PagedLatentCache", "MlagenAttention", "absorbed_weights",
           "model_rope"]

LATENT = ("deepseek_v3", "deepseek_v2", "deepseek_v32")     # MLA on a paged latent cache
POOLED = ("deepseek_v4",)     # a window and compressed pools (transformers_pools), its cache
SUPPORTED = LATENT + POOLED
# model types whose rope is rotated in the half layout, de-interleaving DeepSeek's pairs
HALF_ROPE = ("deepseek_v3", "deepseek_v32")
DESCALE_HEADROOM = 2.0    # fp8_e4m3: the layer's descale is this x amax / 448 of its first write


def _attn_modules(model: nn.Module) -> list[tuple[nn.Module, str, nn.Module]]:
    found = []
    for parent in model.modules():
        for name, child in parent.named_children():
            if name == "self_attn" and hasattr(child, "kv_b_proj"):
                found.append((parent, name, child))
    return found


def _config(model: nn.Module):
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "model_type", None) not in SUPPORTED:
        raise InputError(f"mlagen's transformers integration takes a model of type "
                         f"{' or '.join(SUPPORTED)}; got "
                         f"{getattr(cfg, 'model_type', type(model).__name__)}")
    return cfg


def model_rope(config) -> RopeConfig:
    """The model's RoPE as the paged cache holds it: DeepseekV3 with rope_interleave rotates
    de-interleaved dims (half layout); DeepseekV2 rotates interleaved pairs in place."""
    rope = RopeConfig.from_hf(config)
    if config.model_type in HALF_ROPE:
        import dataclasses

        return dataclasses.replace(rope, layout="half")
    return rope


def _permute_rope(config) -> bool:
    return config.model_type in HALF_ROPE and bool(getattr(config, "rope_interleave", True))


def absorbed_weights(attn: nn.Module, config, heads: tuple[int, int],
                     dtype: torch.dtype) -> FusedWeights:
    """W_UQ [q_lora_rank, h, nope + rope], W_UK [h, nope, rank], W_UV [h, rank, v] of heads
    [lo, hi), from q_b_proj (or q_proj) and kv_b_proj; the rope columns de-interleaved when
    the model rotates them so."""
    lo, hi = heads
    nope, rope_dim = config.qk_nope_head_dim, config.qk_rope_head_dim
    v, rank = config.v_head_dim, config.kv_lora_rank
    n_heads = config.num_attention_heads
    q_w = (attn.q_b_proj if attn.q_b_proj is not None else attn.q_proj).weight.detach()
    w_uq = q_w.reshape(n_heads, nope + rope_dim, -1)[lo:hi].permute(2, 0, 1)   # [r, h, e]
    if _permute_rope(config):
        perm = torch.cat((torch.arange(nope), nope + deinterleave_perm(rope_dim)))
        w_uq = w_uq[..., perm.to(w_uq.device)]
    kv_w = attn.kv_b_proj.weight.detach().reshape(n_heads, nope + v, rank)[lo:hi]
    w_uk = kv_w[:, :nope]                                                       # [h, nope, rank]
    w_uv = kv_w[:, nope:].transpose(1, 2)                                       # [h, rank, v]
    return FusedWeights(w_uq.to(dtype).contiguous(), w_uk.to(dtype).contiguous(),
                        w_uv.to(dtype).contiguous(), rope=model_rope(config))


# ------------------------------------------------------------------ the paged cache -----
class PagedLatentLayer(CacheLayerMixin):
    """One layer's latent cache: k_cache [num_blocks, page, 1, kv_lora_rank + rope] and the
    length of each sequence; the block table is the cache's (shared by the layers)."""

    is_sliding = False
    is_compileable = False

    def __init__(self, owner: "PagedLatentCache"):
        super().__init__()
        self.owner = owner
        self.k_cache: Optional[torch.Tensor] = None
        self.k_descale: Optional[torch.Tensor] = None   # fp8_e4m3: fp32 [1], set by the first write
        self.seqlens = torch.zeros(owner.n_seqs, dtype=torch.int32)
        self.processed = 0       # token columns seen (pads included): transformers' length
        # a sparse model's indexer keys [b, columns, index_head_dim], pads included, kept in
        # torch as transformers keeps them (its indexer scores every column)
        self.indexer_keys: Optional[torch.Tensor] = None

    def lazy_initialization(self, key_states, value_states) -> None:
        pass

    def update(self, key_states, value_states, *args, **kwargs):
        raise InputError("this cache is written by mlagen's attention; a layer not switched by "
                         "mlagen.integrations.transformers.enable() called update()")

    def update_indexer(self, indexer_key_states: torch.Tensor) -> torch.Tensor:
        """transformers' indexer writes its keys here and scores all of them."""
        k = indexer_key_states
        self.indexer_keys = k if self.indexer_keys is None else torch.cat(
            (self.indexer_keys, k), dim=1)
        return self.indexer_keys

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.processed + query_length, 0

    def get_seq_length(self) -> int:
        return self.processed

    def get_max_length(self) -> int:
        return self.owner.max_length

    def reset(self) -> None:
        self.seqlens.zero_()
        self.processed = 0
        self.k_descale = None
        self.indexer_keys = None
        if self.k_cache is not None:
            self._fill_nan()

    def _fill_nan(self) -> None:
        """Every slot NaN in its format's meaning (values, scales and rope alike)."""
        fmt = kvformat.get(self.owner.kv_format) if self.owner.kv_format else None
        if fmt is None or not fmt.quantized:
            self.k_cache.fill_(float("nan"))
            return
        d = self.owner.rank + self.owner.rope_dim
        row = kvformat.quantize(torch.full((1, d), float("nan")), fmt.name,
                                torch.ones(1) if fmt.needs_descale else None, self.owner.rank)
        self.k_cache.view(torch.uint8)[:] = row.view(torch.uint8).reshape(-1).to(
            self.k_cache.device)

    def reorder_cache(self, beam_idx) -> None:
        raise InputError("mlagen's paged latent cache does not reorder sequences (beam search)")

    def append(self, latent: torch.Tensor, n_new: torch.Tensor) -> None:
        """Write the last n_new[i] tokens of latent[i] ([b, s, d]) after sequence i's tokens."""
        b, s, d = latent.shape
        owner = self.owner
        # "" keeps the model's own dtype, whatever it is (the torch target takes fp32 too)
        fmt = kvformat.get(owner.kv_format) if owner.kv_format else None
        if fmt is not None and not fmt.quantized \
                and kvformat.PLAIN_DTYPES[fmt.name] != latent.dtype:
            raise InputError(f"a {fmt.name} cache stores the model's dtype; the model is "
                             f"{latent.dtype}")
        quant = fmt is not None and fmt.quantized
        if self.k_cache is None:
            width = fmt.width(owner.rank, d - owner.rank) if quant else d
            self.k_cache = torch.empty((owner.num_blocks, owner.page_size, 1, width),
                                       dtype=kvformat.FP8 if quant else latent.dtype,
                                       device=latent.device)
            self._fill_nan()
        new_len = self.seqlens + n_new.to(torch.int32)
        self.owner.reserve(new_len)
        page = self.owner.page_size
        rows, cols, slots = [], [], []
        for i in range(b):
            n, start = int(n_new[i]), int(self.seqlens[i])
            if n:
                rows.append(torch.full((n,), i))
                cols.append(torch.arange(s - n, s))
                slots.append(torch.arange(start, start + n))
        if rows:
            r, c, t = torch.cat(rows), torch.cat(cols), torch.cat(slots)
            table = self.owner.block_table
            blocks = table[r, t // page].long()
            kv = latent[r.to(latent.device), c.to(latent.device)]              # [n, d]
            if not quant:
                self.k_cache[blocks.to(latent.device), (t % page).to(latent.device), 0] = kv
            else:
                if fmt.needs_descale and self.k_descale is None:
                    amax = float(kv.float().abs().max())
                    self.k_descale = torch.tensor(
                        [DESCALE_HEADROOM * amax / kvformat.E4M3_MAX if amax > 0 else 1.0],
                        dtype=torch.float32, device=latent.device)
                kvformat.write(self.k_cache, blocks * page + t % page, kv, fmt.name,
                               self.k_descale, owner.rank)
        self.seqlens = new_len
        self.processed += s


class PagedLatentCache(Cache):
    """A paged latent cache (c_kv | k_rope per token) for mlagen's attention, given to
    generate() as past_key_values.  Pages are handed out as sequences grow, from one pool
    of ceil(max_length / page_size) pages per sequence; the block table is shared by the
    layers."""

    def __init__(self, model: nn.Module, batch_size: int, max_length: int, page_size: int = 64,
                 kv_format: Optional[str] = None):
        cfg = _config(model)
        if cfg.model_type not in LATENT:
            raise InputError(f"a {cfg.model_type} model keeps transformers' own cache (its "
                             "window and compressed pools): generate() without past_key_values")
        if batch_size < 1 or max_length < 1:
            raise InputError("batch_size and max_length must be >= 1")
        if not 1 <= page_size <= 256:
            raise InputError(f"page_size = {page_size} must be between 1 and 256")
        # the format of every layer's pages; None: the model's dtype (known at the first write)
        self.kv_format = kvformat.get(kv_format).name if kv_format else ""
        if kvformat.get(self.kv_format or "bf16").paged:
            raise InputError(f"kv_format {kv_format!r} is laid out per page; the cache writes "
                             "tokens (use fp8_e4m3 or fp8_ds_mla)")
        self.rank, self.rope_dim = cfg.kv_lora_rank, cfg.qk_rope_head_dim
        self.n_seqs, self.max_length, self.page_size = batch_size, max_length, page_size
        self.max_blocks = -(-max_length // page_size)
        self.num_blocks = batch_size * self.max_blocks
        self.block_table = torch.zeros(batch_size, self.max_blocks, dtype=torch.int32)
        self.pages_used = torch.zeros(batch_size, dtype=torch.int64)
        self._free = list(range(self.num_blocks))
        super().__init__(layers=[PagedLatentLayer(self) for _ in range(cfg.num_hidden_layers)])

    def reserve(self, lengths: torch.Tensor) -> None:
        need = (lengths.long() + self.page_size - 1) // self.page_size
        if int(lengths.max()) > self.max_length:
            raise InputError(f"a sequence of {int(lengths.max())} tokens does not fit the "
                             f"cache's max_length {self.max_length}")
        for i in range(self.n_seqs):
            while self.pages_used[i] < need[i]:
                self.block_table[i, self.pages_used[i]] = self._free.pop(0)
                self.pages_used[i] += 1

    def reset(self) -> None:
        for layer in self.layers:
            layer.reset()
        self.block_table.zero_()
        self.pages_used.zero_()
        self._free = list(range(self.num_blocks))

    def reorder_cache(self, beam_idx) -> None:
        raise InputError("mlagen's paged latent cache does not reorder sequences (beam search)")


# ------------------------------------------------------------------ the attention -------
class MlagenAttention(nn.Module):
    """A DeepseekV3/V2 attention layer whose latent attention runs through mlagen."""

    def __init__(self, attn: nn.Module, config, *, target: str, tp: int, rank: int,
                 page_size: int, max_s_q: int, group=None, knobs: Optional[dict] = None):
        super().__init__()
        self.inner = attn                       # keeps the projections (and their weights)
        self.config, self.layer_idx = config, attn.layer_idx
        self.tp, self.rank, self.group = tp, rank, group
        self.heads = head_range(config.num_attention_heads, tp, rank)
        dtype = attn.kv_b_proj.weight.dtype
        weights = absorbed_weights(attn, config, self.heads, dtype)
        self.rope = weights.rope
        self.softmax_scale = self.rope.softmax_scale(config.qk_nope_head_dim
                                                     + config.qk_rope_head_dim)
        # a sparse model (DeepSeek-V3.2's DSA): its indexer (in torch) picks the keys
        self.indexer = getattr(attn, "indexer", None)
        if self.indexer is not None:
            self.decoder = SparseLatentDecoder(weights, self.softmax_scale, target=target,
                                               max_s_q=max_s_q, dtype=dtype,
                                               page_size=page_size,
                                               topk=int(self.indexer.index_topk))
        else:
            self.decoder = LatentDecoder(weights, self.softmax_scale, target=target,
                                         page_size=page_size, max_s_q=max_s_q,
                                         heads_total=config.num_attention_heads, tp=tp,
                                         dtype=dtype, knobs=knobs)
        v = config.v_head_dim
        lo, hi = self.heads
        self.register_buffer("o_w", attn.o_proj.weight.detach()[:, lo * v:hi * v].contiguous(),
                             persistent=False)
        self._k_perm = deinterleave_perm(config.qk_rope_head_dim) if _permute_rope(config) \
            else None

    def forward(self, hidden_states: torch.Tensor, position_embeddings=None,
                attention_mask=None, past_key_values=None, cache=None, **kwargs: Any):
        a, cfg = self.inner, self.config
        # transformers 5.17 hands the cache to attention as past_key_values, later 5.x as cache
        past_key_values = cache if past_key_values is None else past_key_values
        if not isinstance(past_key_values, PagedLatentCache):
            raise InputError("mlagen's attention needs past_key_values=PagedLatentCache(model, "
                             "batch_size, max_length) (got "
                             f"{type(past_key_values).__name__})")
        layer = past_key_values.layers[self.layer_idx]
        b, s, _ = hidden_states.shape
        if b != past_key_values.n_seqs:
            raise InputError(f"batch {b} differs from the cache's {past_key_values.n_seqs}")
        q_lora = a.q_a_layernorm(a.q_a_proj(hidden_states)) if a.q_a_proj is not None \
            else hidden_states
        c_kv, k_pe = torch.split(a.kv_a_proj_with_mqa(hidden_states),
                                 [cfg.kv_lora_rank, cfg.qk_rope_head_dim], dim=-1)
        c_kv = a.kv_a_layernorm(c_kv)
        if self._k_perm is not None:
            k_pe = k_pe[..., self._k_perm.to(k_pe.device)]
        n_new, pos = self._new_tokens(layer, kwargs.get("position_ids"), b, s,
                                      hidden_states.device)
        k_rot = rotate(k_pe.float(), pos, self.rope).to(c_kv.dtype)
        layer.append(torch.cat((c_kv, k_rot), dim=-1), n_new)
        dev = hidden_states.device
        seqlens = layer.seqlens.to(dev)
        table = past_key_values.block_table.to(dev)
        if self.indexer is None:
            out = self.decoder(q_lora.contiguous(), layer.k_cache, table, seqlens,
                               k_descale=layer.k_descale)                       # [b, s, h, v]
        else:
            indices = self._selected(hidden_states, q_lora, position_embeddings,
                                     attention_mask, kwargs.get("position_ids"),
                                     past_key_values, layer, table, seqlens)
            out = self.decoder(q_lora.contiguous(), layer.k_cache, table, seqlens, indices,
                               kv_format=past_key_values.kv_format, k_descale=layer.k_descale)
        partial = out.reshape(b, s, -1).float() @ self.o_w.float().t()
        all_reduce_sum(partial, self.group)
        if a.o_proj.bias is not None:
            partial = partial + a.o_proj.bias.float()
        return partial.to(hidden_states.dtype), None

    def _selected(self, hidden_states, q_lora, position_embeddings, attention_mask,
                  position_ids, cache, layer, table, seqlens) -> torch.Tensor:
        """The cache slots [b, s, topk] each query attends to: the model's indexer picks
        top-k of the columns its mask lets the query see (all of them when fewer), as in
        transformers' eager attention, which attends to the picked columns its mask keeps."""
        if attention_mask is None:
            raise InputError("a sparse model's attention needs the model's 4-D attention mask "
                             "(its indexer scores against it)")
        mask = attention_mask[:, 0]                                             # [b, s, T]
        cols = self.indexer(hidden_states, q_lora, position_embeddings, mask, position_ids,
                            cache=cache)                                        # [b, s, k]
        n_columns = mask.shape[-1]
        if n_columns != layer.processed:
            raise InputError(f"the attention mask has {n_columns} key columns; the cache has "
                             f"seen {layer.processed}")
        seen = torch.gather(mask, -1, cols.long())
        visible = seen if seen.dtype == torch.bool else seen > torch.finfo(seen.dtype).min / 2
        return visible_slots(cols, visible, table, cache.page_size, seqlens, n_columns)

    @staticmethod
    def _new_tokens(layer: PagedLatentLayer, position_ids, b: int, s: int, device
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """How many of the s tokens of each row are real (the last ones: left padding) and
        the position of every token column (pads: any)."""
        have = layer.seqlens.long()
        if position_ids is None:
            n_new = torch.full((b,), s, dtype=torch.long)
        else:
            pid = position_ids.detach().long().cpu().expand(b, s)
            n_new = pid[:, -1] + 1 - have
            bad = (n_new < 0) | (n_new > s)
            if bad.any():
                i = int(bad.nonzero()[0])
                raise InputError(f"row {i}: position {int(pid[i, -1])} does not continue its "
                                 f"{int(have[i])} cached tokens (only left padding is supported)")
            cols = torch.arange(s)[None, :]
            real = cols >= s - n_new[:, None]
            want = have[:, None] + cols - (s - n_new[:, None])
            if not torch.equal(torch.where(real, pid, 0), torch.where(real, want, 0)):
                raise InputError("position_ids must number each row's real tokens "
                                 "consecutively after its cached ones (left padding only)")
        pos = have[:, None] + torch.arange(s)[None, :] - (s - n_new[:, None])   # pads < start
        return n_new, pos.to(device)


def enable(model: nn.Module, target: Optional[str] = None, *, page_size: int = 64,
           max_s_q: int = 1, group=None, knobs: Optional[dict] = None) -> nn.Module:
    """Switch every attention layer of a DeepseekV3 / DeepseekV2 / DeepseekV32 model to mlagen,
    in place (a DeepseekV4 model: PooledAttention; its decode steps on a target that generates
    its two-pool kernel, the emulated card on CPU, else in torch).

    target: a target kind (mlagen.backends.kinds(): the emulated card takes CPU tensors, the
    GPU kind CUDA ones) or "torch"; default: the kind of the model's device.  Under torch.distributed (world size tp) each rank takes its heads.
    page_size must match the PagedLatentCache given to generate()."""
    cfg = _config(model)
    if cfg.model_type in POOLED:
        return _enable_pooled(model, cfg, target)
    if getattr(cfg, "num_key_value_heads", cfg.num_attention_heads) != cfg.num_attention_heads:
        raise InputError("MLA models have num_key_value_heads == num_attention_heads")
    device = next(model.parameters()).device
    target = target or default_target(device)
    tp, rank = world(group)
    for parent, name, attn in _attn_modules(model):
        if isinstance(attn, MlagenAttention):
            continue
        setattr(parent, name, MlagenAttention(attn, cfg, target=target, tp=tp, rank=rank,
                                              page_size=page_size, max_s_q=max_s_q,
                                              group=group, knobs=knobs))
    return model


def _enable_pooled(model: nn.Module, cfg, target: Optional[str]) -> nn.Module:
    """A window + compressed-pool model (DeepseekV4): its attention runs mlagen's two-pool
    token-sparse operator, decode steps on a target that generates sparse kernels from
    schedules, the rest in torch (on the model's device)."""
    chosen = target is None
    if chosen:
        default = default_target(next(model.parameters()).device)
        target = default if sparse_schedules(default) else "torch"
    if target != "torch" and not sparse_schedules(target):
        raise InputError(f"a {cfg.model_type} model's attention (a window and compressed "
                         f"pools, d_qk {cfg.head_dim}) runs on target 'torch' or one that "
                         f"generates sparse kernels; {target!r} does not")
    if getattr(cfg, "num_key_value_heads", 1) != 1:
        raise InputError("a pooled model has one shared KV head (num_key_value_heads 1)")
    for parent in model.modules():
        for name, child in list(parent.named_children()):
            if name == "self_attn" and hasattr(child, "sinks") and hasattr(child, "kv_proj") \
                    and not isinstance(child, PooledAttention):
                try:
                    attn = PooledAttention(child, cfg, target=target)
                except InputError:
                    if not chosen:
                        raise
                    # the device's kind makes sparse kernels but not this shape: torch
                    target = "torch"
                    attn = PooledAttention(child, cfg, target=target)
                setattr(parent, name, attn)
    return model


def disable(model: nn.Module) -> nn.Module:
    """Put transformers' own attention back."""
    for parent in model.modules():
        for name, child in list(parent.named_children()):
            if isinstance(child, (MlagenAttention, PooledAttention)):
                setattr(parent, name, child.inner)
    return model
