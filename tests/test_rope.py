"""RoPE as models define it (mlagen.rope): against transformers' DeepseekV3 rotary / YaRN code,
and in the SC11 fused operator (config or rotary table, both layouts) against the oracle."""

from __future__ import annotations

import dataclasses
import functools
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlagen import reference
from mlagen.backends import sc11
from mlagen.errors import InputError
from mlagen.problem import make_inputs
from mlagen.rope import RopeConfig, RotaryTable, cos_sin, deinterleave_perm, rotate
from mlagen.schedule.records import Schedule
from mlagen.verify.compare import compare
from mlagen.verify.oracle import fused_rounded

# DeepSeek-V3's config.json: rope_theta 10000, rope_scaling {type yarn, factor 40,
# original_max_position_embeddings 4096, beta_fast 32, beta_slow 1, mscale 1, mscale_all_dim 1}
DSV3_SCALING = dict(type="yarn", factor=40, original_max_position_embeddings=4096,
                    beta_fast=32, beta_slow=1, mscale=1.0, mscale_all_dim=1.0)
DSV3 = RopeConfig.from_dict({**DSV3_SCALING, "rope_theta": 10000.0})


# ---------------------------------------------------------------- the formulas --------
def test_deepseek_v3_constants():
    """YaRN's mscale with mscale == mscale_all_dim: cos/sin unscaled, softmax scale
    192**-0.5 * (0.1 ln 40 + 1)**2."""
    assert DSV3.attention_scaling == 1.0
    m = 0.1 * math.log(40) + 1
    assert DSV3.softmax_scale(192) == pytest.approx(192 ** -0.5 * m * m, rel=1e-12)
    f = DSV3.inv_freq(64)
    base = 10000.0 ** (-torch.arange(0, 64, 2, dtype=torch.float64) / 64)
    # highest frequencies kept, lowest divided by the factor (the ramp lies in between)
    assert torch.equal(f[:10], base[:10]) and torch.allclose(f[-8:], base[-8:] / 40)
    assert (f <= base).all() and (f >= base / 40 - 1e-18).all()


def test_default_matches_the_plain_rope():
    x = torch.randn(3, 5, 64, dtype=torch.float64)
    pos = torch.tensor([0, 7, 4097, 100_000, 163_839])[None, :]
    assert torch.equal(rotate(x, pos, RopeConfig(theta=500.0)),
                       reference.rope(x, pos, theta=500.0))


def test_layouts_are_one_permutation_apart():
    """Rotating interleaved pairs then de-interleaving == de-interleaving then rotating halves
    (how transformers' rope_interleave path relates to DeepSeek's reference)."""
    x = torch.randn(4, 64, dtype=torch.float64)
    pos = torch.tensor([3, 70, 4000, 150_000])
    perm = deinterleave_perm(64)
    a = rotate(x, pos, DSV3)[..., perm]
    b = rotate(x[..., perm], pos, dataclasses.replace(DSV3, layout="half"))
    assert torch.allclose(a, b, atol=1e-12)


def test_table_and_config_agree_and_bad_tables_refused():
    t = DSV3.table(300, 64)
    x = torch.randn(5, 64, dtype=torch.float64)
    pos = torch.tensor([0, 1, 17, 298, 299])
    assert torch.allclose(rotate(x, pos, t), rotate(x, pos, DSV3), atol=1e-6)
    with pytest.raises(InputError, match="past the rotary table"):
        rotate(x, torch.tensor([300]), t)
    with pytest.raises(InputError, match="frequencies"):
        rotate(torch.randn(2, 32), torch.tensor([1, 2]), t)
    with pytest.raises(InputError, match="kind"):
        RopeConfig(kind="dynamic")


# ------------------------------------------------- against transformers (independent) ----
def _hf():
    return pytest.importorskip("transformers", minversion="5.0")


def _hf_config(scaling: dict | None, theta: float, interleave: bool = True):
    from transformers import DeepseekV3Config

    params = {"rope_type": "default", "rope_theta": theta}
    if scaling:
        params = {**{k: v for k, v in scaling.items() if k != "type"},
                  "rope_type": scaling["type"], "rope_theta": theta}
    return DeepseekV3Config(
        vocab_size=64, hidden_size=64, intermediate_size=64, moe_intermediate_size=32,
        num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
        n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
        kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64, qk_nope_head_dim=128,
        v_head_dim=128, max_position_embeddings=163840, rope_parameters=params,
        rope_interleave=interleave)


@st.composite
def rope_configs(draw):
    kind = draw(st.sampled_from(["default", "linear", "yarn", "yarn"]))
    theta = draw(st.sampled_from([10000.0, 50000.0, 1e6, 500.0]))
    if kind == "default":
        return None, theta
    scaling = dict(type=kind, factor=draw(st.sampled_from([2.0, 4.0, 8.0, 40.0])))
    if kind == "yarn":
        scaling.update(original_max_position_embeddings=draw(st.sampled_from([2048, 4096])),
                       beta_fast=draw(st.sampled_from([32, 16])),
                       beta_slow=draw(st.sampled_from([1, 2])),
                       mscale=draw(st.sampled_from([1.0, 0.707])),
                       mscale_all_dim=draw(st.sampled_from([1.0, 0.0, 0.707])))
    return scaling, theta


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(rope_configs(), st.lists(st.integers(0, 163_839), min_size=1, max_size=6),
       st.booleans())
def test_against_transformers_deepseek_v3(cfg, positions, interleave):
    """inv_freq, the cos/sin scaling, the softmax scale and the rotation of q and k equal
    transformers' DeepseekV3 code (v5), positions up to 160k."""
    _hf()
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as M

    scaling, theta = cfg
    hc = _hf_config(scaling, theta, interleave)
    ours = RopeConfig.from_hf(hc)
    rot = M.DeepseekV3RotaryEmbedding(hc)
    assert torch.allclose(ours.inv_freq(64).float(), rot.inv_freq, rtol=2e-6, atol=0)
    assert ours.attention_scaling == pytest.approx(rot.attention_scaling, rel=1e-12)
    assert ours.softmax_scale(192) == pytest.approx(M.DeepseekV3Attention(hc, 0).scaling,
                                                    rel=1e-12)
    pos = torch.tensor(positions)[None, :]
    x = torch.randn(1, 1, pos.shape[1], 64, dtype=torch.float32)
    hf_cos, hf_sin = rot(x, pos)                      # [1, n, 64]: float32 angles
    c, s = ours.cos_sin(pos, 64)
    # transformers forms pos * inv_freq in float32: its angle is off by ~pos * f * 2^-23
    slack = 4e-7 * pos[0, :, None].double() * ours.inv_freq(64).abs().max() + 2e-6
    assert ((hf_cos[0, :, :32].double() - c[0]).abs() <= slack).all()
    assert ((hf_sin[0, :, :32].double() - s[0]).abs() <= slack).all()
    # the rotation of q and k with the same cos / sin: layouts must match exactly
    q = torch.randn(1, 2, pos.shape[1], 64, dtype=torch.float64)
    cc, ss = c.float().double(), s.float().double()
    full_c, full_s = torch.cat([cc, cc], -1), torch.cat([ss, ss], -1)
    apply = M.apply_rotary_pos_emb_interleave if interleave else M.apply_rotary_pos_emb
    hq, hk = apply(q, q[:, :1], full_c, full_s)
    table = RotaryTable(cc[0], ss[0], ours.layout)
    mine = rotate(q, torch.arange(pos.shape[1]), table)
    if interleave:                       # transformers de-interleaves as it rotates
        mine = mine[..., deinterleave_perm(64)]
    assert torch.allclose(hq, mine, atol=1e-12)
    assert torch.allclose(hk, mine[:, :1], atol=1e-12)


# ------------------------------------------------------- the SC11 fused operator --------
VARIANT = dict(heads=4, tp=1, q_lora_rank=128, page_size=16, dtype="bf16", block_kv=16,
               buffers=2, seq_tile=64, cores=4, max_s_q=2, fused=True)


@functools.lru_cache(maxsize=None)
def _runner():
    return sc11.runner(Schedule.build(name="rope", target="sc11", **VARIANT))


def _check(inp, scheme="batch_seq", expect_ok=True):
    out = _runner()(inp, scheme=scheme)
    ok = compare(out, fused_rounded(inp), "bf16")
    assert bool(ok) == expect_ok, ok.summary()
    return out


@st.composite
def kernel_cases(draw):
    kind = draw(st.sampled_from(["default", "linear", "yarn"]))
    rope = RopeConfig(kind=kind, theta=draw(st.sampled_from([10000.0, 1e6, 300.0])),
                      factor=draw(st.sampled_from([4.0, 40.0])),
                      original_max_position_embeddings=draw(st.sampled_from([64, 4096])),
                      mscale=draw(st.sampled_from([1.0, 0.707])),
                      mscale_all_dim=draw(st.sampled_from([1.0, 0.0])),
                      layout=draw(st.sampled_from(["interleaved", "half"])))
    lens = draw(st.lists(st.sampled_from([0, 1, 15, 16, 17, 64, 100, 200]), min_size=1,
                         max_size=4))
    # a table whose row p holds position p + offset: the kernel then rotates as at
    # positions up to 160k (a cache that long is too slow for the float64 oracle on CI)
    offset = draw(st.sampled_from([None, 0, 4095, 65_536, 163_000]))
    return rope, lens, draw(st.integers(1, 2)), offset, draw(st.integers(0, 2**16))


@settings(max_examples=30, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(kernel_cases())
def test_fused_kernel_rope_matches_the_oracle(case):
    rope, lens, s_q, offset, seed = case
    s = _runner().schedule
    inp = make_inputs(s.problem, len(lens), lens, s_q=s_q, heads=4, seed=seed)
    if offset is not None:
        rows = max(lens) + 1
        c, sn = rope.cos_sin(torch.arange(rows) + offset, 64)
        rope = RotaryTable(c.float(), sn.float(), rope.layout)
    inp = dataclasses.replace(inp, weights=dataclasses.replace(inp.weights, rope=rope),
                              softmax_scale=rope.softmax_scale(192)
                              if isinstance(rope, RopeConfig) else inp.softmax_scale)
    _check(inp)


def test_wrong_rope_is_caught():
    """The oracle sees a rope the kernel did not apply: layout, YaRN vs plain, table rows."""
    s = _runner().schedule
    inp = make_inputs(s.problem, 3, [200, 90, 33], s_q=1, heads=4, seed=3)
    w = inp.weights
    run = lambda r: _runner()(dataclasses.replace(inp, weights=dataclasses.replace(w, rope=r)),  # noqa: E731
                              scheme="batch")
    want = fused_rounded(dataclasses.replace(inp, weights=dataclasses.replace(w, rope=DSV3)))
    assert compare(run(DSV3), want, "bf16")
    assert not compare(run(dataclasses.replace(DSV3, layout="half")), want, "bf16")
    assert not compare(run(RopeConfig()), want, "bf16")
    shifted = DSV3.cos_sin(torch.arange(1, 202), 64)
    assert not compare(run(RotaryTable(shifted[0].float(), shifted[1].float())), want, "bf16")


def test_short_table_is_refused():
    s = _runner().schedule
    inp = make_inputs(s.problem, 2, [40, 10], s_q=1, heads=4, seed=1)
    t = DSV3.table(39, 64)
    bad = dataclasses.replace(inp, weights=dataclasses.replace(inp.weights, rope=t))
    with pytest.raises(InputError, match="rotary table"):
        _runner()(bad)


# ------------------------------------------------------- negative positions --------------
@pytest.mark.parametrize("rope", [RopeConfig(), DSV3, dataclasses.replace(DSV3, layout="half")],
                         ids=["default", "yarn", "yarn-half"])
def test_a_negative_position_turns_by_the_negative_angle(rope):
    """Rows of a sequence shorter than s_q sit at negative positions; without causal they see
    keys.  A table and its config agree there, and -p undoes +p."""
    table = rope.table(16, 64)
    pos = torch.tensor([-5, -1, 0, 3])
    for a, b in zip(cos_sin(table, pos, 64), rope.cos_sin(pos, 64)):
        assert torch.allclose(a.double(), b, atol=1e-6)
    x = torch.randn(4, 64, dtype=torch.float64)
    back = rotate(rotate(x, pos, rope), -pos, rope)
    scale = rope.attention_scaling ** 2           # cos^2 + sin^2 of a scaled table
    assert torch.allclose(back, x * scale, atol=1e-9)
    with pytest.raises(InputError, match="position 16 is past the rotary table's 16 rows"):
        cos_sin(table, torch.tensor([16]), 64)
    # past the table, a negative position (a row that sees no key) turns by nothing
    c, s = cos_sin(table, torch.tensor([-16]), 64)
    assert (c == 1).all() and (s == 0).all()


@pytest.mark.parametrize("rope", [None, DSV3, DSV3.table(64, 64)], ids=["plain", "yarn", "table"])
def test_non_causal_rows_at_negative_positions_match_the_oracle(rope):
    """A non-causal fused decode with a sequence shorter than s_q: its first row sits at
    position -1 and sees the one key; every scheme agrees with the reference."""
    s = _runner().schedule
    inp = make_inputs(s.problem, 3, [1, 0, 40], s_q=2, heads=4, seed=7)
    inp = dataclasses.replace(inp, causal=False)
    if rope is not None:
        inp = dataclasses.replace(inp, weights=dataclasses.replace(inp.weights, rope=rope))
    for scheme in ("heads", "batch", "seq", "batch_seq"):
        _check(inp, scheme)


def test_a_table_too_short_for_a_negative_row_is_refused():
    s = _runner().schedule
    inp = make_inputs(s.problem, 1, [1], s_q=2, heads=4, seed=1)
    t = DSV3.table(1, 64)                         # holds position 0, not -1
    bad = dataclasses.replace(inp, causal=False,
                              weights=dataclasses.replace(inp.weights, rope=t))
    with pytest.raises(InputError, match="position -1 .* needs the rotary table's row 1"):
        _runner()(bad)
    with pytest.raises(InputError, match="position -1 .* needs the rotary table's row 1"):
        fused_rounded(bad)                              # the reference too
    _check(dataclasses.replace(bad, causal=True))       # causal: that row sees nothing
