"""The SC11 kernel's sources: the template's constants for one plan (no torch here, so
`mlagen generate` and `check` start fast)."""

from __future__ import annotations

from ... import formats   # KV formats as data (no torch: check and generate stay light)
from ...codegen import SourceSet, render_template
from ...paths import TEMPLATES_DIR
from ...schedule.plan import Plan
from ...schedule.records import Schedule
from ...schedule.rules import plan_of
from .resources import SC11_PROJ_ROWS, sc11_granules, sc11_heads_per_core

RUNTIME_DIR = TEMPLATES_DIR / "sc11" / "runtime"
FLAGS = ("-O3", "-march=native", "-std=c++17", "-pthread", "-fno-math-errno")
FAULT_ENUMS = {"none": "FAULT_NONE", "causal_off_by_one": "FAULT_CAUSAL_OFF_BY_ONE",
               "wrong_scale": "FAULT_WRONG_SCALE", "skip_partial_page": "FAULT_SKIP_PARTIAL_PAGE",
               "bad_split_merge": "FAULT_BAD_SPLIT_MERGE",
               "early_buffer_swap": "FAULT_EARLY_BUFFER_SWAP",
               "proj_first_chunk_only": "FAULT_PROJ_FIRST_CHUNK_ONLY",
               "ignore_softmax_scale": "FAULT_IGNORE_SOFTMAX_SCALE",
               "page_start_assumed": "FAULT_PAGE_START_ASSUMED",
               "empty_partial_unmasked": "FAULT_EMPTY_PARTIAL_UNMASKED",
               "default_head_split": "FAULT_DEFAULT_HEAD_SPLIT",
               "kv_scale_twice": "FAULT_KV_SCALE_TWICE",
               "kv_scale_wrong_tile": "FAULT_KV_SCALE_WRONG_TILE",
               "descale_not_in_output": "FAULT_DESCALE_NOT_IN_OUTPUT",
               "sparse_offset_off_by_one": "FAULT_SPARSE_OFFSET_OFF_BY_ONE",
               "sparse_invalid_read": "FAULT_SPARSE_INVALID_READ",
               "sparse_topk_length_plus_one": "FAULT_SPARSE_TOPK_LENGTH_PLUS_ONE",
               "sink_in_lse": "FAULT_SINK_IN_LSE", "sink_sign": "FAULT_SINK_SIGN",
               "extra_page_for_main": "FAULT_EXTRA_PAGE_FOR_MAIN"}
DTYPE_CLASSES = {"bf16": "Bf16", "fp16": "Fp16"}
# mlagen.formats names -> mla.h's KvFormat
KV_ENUMS = {"bf16": "KV_PLAIN", "fp16": "KV_PLAIN", "fp8_e4m3": "KV_E4M3",
            "fp8_ds_mla": "KV_DS_MLA", "fp8_ue8m0_paged": "KV_UE8M0_PAGED"}


def render(plan: Plan | Schedule) -> SourceSet:
    """The kernel source of a checked SC11 plan (one translation unit)."""
    plan = plan_of(plan)
    schedule, t = plan.schedule, plan.target
    p = schedule.problem
    lmem_granule, l2_granule = sc11_granules(t)
    name = "kernel.cpp"
    text = render_template(
        schedule, "kernel.cpp.j2", name,
        dtype_class=DTYPE_CLASSES[schedule.problem.dtype],
        heads=schedule.heads_per_device,
        heads_per_core=sc11_heads_per_core(schedule),
        proj_rows=SC11_PROJ_ROWS,
        fault_enum=FAULT_ENUMS[schedule.fault],
        kv_enum=KV_ENUMS[p.kv],
        kv_bytes=formats.get(p.kv).token_bytes(p.kv_lora_rank, p.rope_dim),
        lmem_bytes=int(t.lmem_bytes), lmem_granule=lmem_granule,
        l2_bytes=int(t.l2_bytes), l2_granule=l2_granule)
    return SourceSet(variant=plan.variant, target="sc11", files={name: text},
                     include_dirs=(str(RUNTIME_DIR),), compiler="c++", flags=FLAGS,
                     sources=(name,))
