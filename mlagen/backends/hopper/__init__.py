"""The Hopper (sm_90a) backend: paged split-KV MLA decode, a drop-in for FlashMLA.

    render(schedule) -> SourceSet     four translation units (scheduler, split, combine, C ABI)
    runner(schedule) -> callable      MlaInputs -> MlaOutputs through the FlashMLA-style API

The algorithm lives in templates/hopper/include/*.cuh; the .cu.j2 templates only pick the
variant's constants.  api.py holds get_mla_metadata / flash_mla_with_kvcache.
"""

from __future__ import annotations

from mlagen.codegen import SourceSet, render_template
from mlagen.paths import TEMPLATES_DIR
from mlagen.schedule.plan import Plan
from mlagen.schedule.rules import plan_of
from mlagen.schedule.records import Schedule

from .abi import EXTRA_INDEX, KV_CODE, SHAPE_INDEX

DTYPE_CPP = {"bf16": "__nv_bfloat16", "fp16": "__half"}
DTYPE_CODE = {"bf16": 1, "fp16": 2}
# planted faults (records.FAULTS) -> MLAGEN_FAULT in templates/hopper/include/mla_common.cuh
FAULT_CODE = {"none": 0, "causal_off_by_one": 1, "wrong_scale": 2, "skip_partial_page": 3,
              "bad_split_merge": 4, "early_buffer_swap": 5, "kv_scale_wrong_tile": 6,
              "kv_scale_twice": 7, "descale_not_in_output": 8}
# the dequantization faults mla_wgmma_rows.cuh plants, by the format whose path has them
FP8_FAULTS = {"fp8_e4m3": ("kv_scale_twice", "descale_not_in_output"),
              "fp8_ds_mla": ("kv_scale_wrong_tile", "kv_scale_twice"),
              "fp8_ue8m0_paged": ("kv_scale_wrong_tile", "kv_scale_twice")}
# the faults mla_wgmma.cuh and mla_wgmma_rows.cuh plant (its split kernel; bad_split_merge is the combine's)
WGMMA_FAULTS = ("none", "causal_off_by_one", "wrong_scale", "skip_partial_page",
                "bad_split_merge")
TEMPLATES = ("scheduler", "split", "combine", "api")
# hidden symbols: a library's statics stay its own (api.cu.j2)
FLAGS = ("-gencode=arch=compute_90a,code=sm_90a", "-O3", "-std=c++17", "-lineinfo",
         "--use_fast_math", "-Xcompiler", "-fvisibility=hidden")


def render(plan: Plan | Schedule) -> SourceSet:
    plan = plan_of(plan)
    schedule = plan.schedule
    m, p = schedule.mapping, schedule.problem
    ctx = dict(dtype_cpp=DTYPE_CPP[p.dtype], dtype_code=DTYPE_CODE[p.dtype],
               rows=m.rows_per_tile, block_kv=m.block_kv, buffers=m.buffers, warps=m.warps,
               mainloop=m.mainloop, fault=FAULT_CODE[schedule.fault],
               kv_format=p.kv, kv_code=KV_CODE[p.kv], converters=m.fp8_converters,
               raw_slots=m.fp8_raw_slots, d_qk=p.d,
               # MM: 1 where an 8-bit cache takes e4m3 MMAs (fp8_mma = "mma"), else 0
               fp8_mma=int(m.fp8_mma == "mma" and p.kv not in ("bf16", "fp16")),
               # SP: 0 dense, 1 one pool of sparse keys, 2 two (extra_topk: the extra pool)
               sparse=(2 if p.extra_topk else 1) if p.attention == "sparse" else 0)
    # the wgmma main loop is its own split kernel (mla_wgmma.cuh; 16 or 32 rows per tile:
    # mla_wgmma_rows.cuh, the rows in wgmma's N); the rest is shared
    split = "split"
    if m.mainloop == "wgmma":
        split = "split_wgmma" if m.rows_per_tile == 64 else "split_wgmma_rows"
    # the 64-row wgmma kernel writes its partials in fp16 with a scale per half-row
    # (mla_wgmma.cuh store_o), which its combine reads
    ctx["half_partials"] = split == "split_wgmma"
    fp8 = FP8_FAULTS.get(p.kv, ())
    if schedule.fault in FAULT_CODE and FAULT_CODE[schedule.fault] >= 6 \
            and schedule.fault not in fp8:
        raise ValueError(f"fault {schedule.fault!r} is not planted in the {p.kv} path "
                         f"(it has {', '.join(fp8) or 'no dequantization faults'})")
    if m.mainloop == "wgmma" and schedule.fault not in WGMMA_FAULTS + fp8:
        raise ValueError(f"fault {schedule.fault!r} is not planted in the wgmma main loop "
                         f"(it has {', '.join(WGMMA_FAULTS[1:] + fp8)})")
    files = {f"{t}.cu": render_template(schedule, f"{split if t == 'split' else t}.cu.j2",
                                        f"{t}.cu", shape=SHAPE_INDEX,
                                        extra=EXTRA_INDEX, **ctx)
             for t in TEMPLATES}
    return SourceSet(variant=plan.variant, target="hopper", files=files,
                     include_dirs=(str(TEMPLATES_DIR / "hopper" / "include"),),
                     compiler="nvcc", flags=FLAGS, sources=tuple(f"{t}.cu" for t in TEMPLATES),
                     meta=dict(ctx, dtype=p.dtype))


def runner(plan: Plan | Schedule, use_defaults: bool = False):
    """A callable MlaInputs -> MlaOutputs running this schedule through the public API (with
    use_defaults, the API's own per-shape choice instead: schedule=None)."""
    from mlagen.problem import MlaOutputs

    schedule = None if use_defaults else plan_of(plan).schedule

    from . import api

    def run(inputs, out: MlaOutputs | None = None) -> MlaOutputs:
        if hasattr(inputs, "pools"):      # problem.SparseInputs: the sparse API
            if len(inputs.pools) not in (1, 2):
                raise ValueError("the hopper sparse kernels read one or two pools of keys")
            pool = inputs.pools[0]
            x = inputs.pools[1] if len(inputs.pools) == 2 else None
            sched, _ = api.get_mla_metadata()
            o, lse = api.flash_mla_with_kvcache(
                inputs.q, pool.k_cache, None, None, 512, sched,
                softmax_scale=inputs.softmax_scale,
                is_fp8_kvcache=pool.k_cache.dtype != inputs.q.dtype,
                indices=pool.indices, attn_sink=inputs.attn_sink,
                topk_length=pool.topk_length, schedule=schedule,
                extra_k_cache=None if x is None else x.k_cache,
                extra_indices_in_kvcache=None if x is None else x.indices,
                extra_topk_length=None if x is None else x.topk_length)
            if out is not None:
                out.out.copy_(o)
                out.lse.copy_(lse)
            return MlaOutputs(o, lse, extra={"metadata": sched.tile_scheduler_metadata,
                                             "num_splits": sched.num_splits})
        if inputs.q is None:
            raise ValueError("the hopper target runs attention only (inputs.q is None)")
        q = inputs.q
        s_q, h_q = q.shape[1], q.shape[2]
        md, ns = api.get_mla_metadata(inputs.cache_seqlens, s_q * h_q, 1, schedule=schedule,
                                      kv_format=inputs.kv)
        o, lse = api.flash_mla_with_kvcache(
            q, inputs.k_cache, inputs.block_table, inputs.cache_seqlens,
            512, md, ns, softmax_scale=inputs.softmax_scale,
            causal=inputs.causal, schedule=schedule, descale_k=inputs.k_descale,
            out=None if out is None else (out.out, out.lse))
        return MlaOutputs(o, lse, extra={"metadata": md, "num_splits": ns})

    return run


def defaults_runner(plan: Plan | Schedule):
    """verify(..., runner_factory="mlagen.backends.hopper:defaults_runner"): every drawn
    shape goes through the API's per-shape defaults, so the variants a user gets without a
    schedule are the ones verified (heads 16 with s_q 1..4 reaches the 16-, 32- and 64-row
    classes)."""
    return runner(plan, use_defaults=True)

