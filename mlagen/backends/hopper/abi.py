"""The Hopper C entry's ``shape[]`` array, declared once: the host (ops.py) fills it by
these names and api.cu.j2 reads each entry at the index rendered from here, so the two
sides cannot drift apart."""

from __future__ import annotations

SHAPE_FIELDS = ("q_stride_b", "q_stride_s", "q_stride_h", "k_stride_block", "k_stride_token",
                "k_descale_stride",   # fp8_e4m3: 0 (one descale) or 1 (one a sequence)
                "q_descale_stride",   # 8-bit caches' descale_q: likewise
                "bt_stride", "batch", "s_q", "h_q", "page_size", "num_blocks", "max_blocks",
                "num_parts", "causal",
                "num_sms",       # the device's SMs (the combine sizes its grid by them)
                "lse_offset")    # floats into the workspace where the partial lse starts
SHAPE_INDEX = {name: i for i, name in enumerate(SHAPE_FIELDS)}
# Two pools of sparse keys (mlagen_hopper_decode_pools): the extra pool's extra_shape[]
EXTRA_FIELDS = ("k2_stride_block", "k2_stride_token",   # elements (fp8_ds_mla: bytes)
                "idx2_stride",                            # ints between rows' extra lists
                "page_size2", "num_blocks2")
EXTRA_INDEX = {name: i for i, name in enumerate(EXTRA_FIELDS)}
# KV-cache formats -> the split kernel's KV template argument and mlagen_hopper_kv_format()
# (kKv* in mla_common.cuh)
KV_CODE = {"bf16": 0, "fp16": 0, "fp8_e4m3": 1, "fp8_ds_mla": 2, "fp8_ue8m0_paged": 3}


def shape_array(**values: int) -> list[int]:
    """The values in SHAPE_FIELDS order; every field must be given, nothing else."""
    if set(values) != set(SHAPE_FIELDS):
        raise TypeError(f"shape[] fields: missing {sorted(set(SHAPE_FIELDS) - set(values))}, "
                        f"unknown {sorted(set(values) - set(SHAPE_FIELDS))}")
    return [int(values[name]) for name in SHAPE_FIELDS]


def extra_array(**values: int) -> list[int]:
    """The values in EXTRA_FIELDS order; every field must be given, nothing else."""
    if set(values) != set(EXTRA_FIELDS):
        raise TypeError(f"extra_shape[] fields: missing {sorted(set(EXTRA_FIELDS) - set(values))}"
                        f", unknown {sorted(set(values) - set(EXTRA_FIELDS))}")
    return [int(values[name]) for name in EXTRA_FIELDS]
