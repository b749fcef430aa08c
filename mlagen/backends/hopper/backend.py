"""The Hopper (sm_90a) target as one backend object (see mlagen/backends/base.py)."""

from __future__ import annotations

from ..base import Backend
from . import resources, rules
from .knobs import HopperMapping, gathers_keys


class HopperBackend(Backend):
    kind = "hopper"
    mapping = HopperMapping
    target_file = "h200.toml"
    device = "cuda"
    rounded = ("p",)                  # P is rounded to bf16/fp16 before the P @ V product
    run_point = (64, 4096)
    # 8-bit caches through the few-rows wgmma kernel's converter (mla_fp8.cuh)
    kv_formats = ("bf16", "fp16", "fp8_e4m3", "fp8_ds_mla", "fp8_ue8m0_paged")
    # token-sparse decode (DeepSeek-V3.2's indices): the few-rows wgmma kernel's sparse mode
    # (mla_wgmma_rows.cuh, SP), bf16 and fp8_ds_mla caches (rules.hopper_sparse)
    attentions = ("dense", "sparse")
    # the FlashMLA-compatible calls, reachable as mlagen.<name>
    api_names = ("get_mla_metadata", "flash_mla_with_kvcache")

    def rounded_for(self, s):
        # fp8_mma = "mma": Q quantized per row and P rounded to e4m3 (mla_fp8_regs.cuh)
        if s.mapping.fp8_mma == "mma" and s.problem.kv == "fp8_e4m3":
            return ("q_e4m3", "p_e4m3")
        return self.rounded

    def rules(self):
        return rules.RULES

    def resources(self, s, t):
        return resources.needs(s, t)

    def render(self, plan):
        from . import render

        return render(plan)

    def runner(self, plan, progress: bool = False):
        from . import runner

        return runner(plan)

    def check_environment(self):
        from ...envvars import switch
        from .defaults import check_overrides
        from .tuned import user_table

        check_overrides()            # the knob tables' overrides, MLAGEN_HOPPER_CLUSTER
        switch("MLAGEN_HOPPER_STRICT", False)
        switch("MLAGEN_HOPPER_FASTCALL", True)
        user_table()                 # MLAGEN_HOPPER_TUNE_TABLE

    def device_check(self):
        import torch

        if not torch.cuda.is_available():
            found = "none found"
        else:
            major, minor = torch.cuda.get_device_capability()
            if (major, minor) == (9, 0):           # sm_90a code runs on sm_90 alone
                return None
            found = f"found {torch.cuda.get_device_name()}, sm_{major}{minor}"
        return (f"target hopper needs an NVIDIA sm_90 GPU ({found}); `mlagen check`, "
                f"`generate` and `build` work without one")

    def prebuild(self, progress: bool = False):
        # the eager calls' C++ path (fastcall.py) is built on a process's first call (~15 s
        # cold); `mlagen build` builds it ahead, beside the kernel libraries
        import time
        import warnings

        from ...console import status
        from . import fastcall

        if not fastcall.enabled():
            return "C++ call path: off (MLAGEN_HOPPER_FASTCALL=0)"
        cached = fastcall.intact()
        t0 = time.perf_counter()
        with status(f"mlagen: building the C++ call path in {fastcall.build_dir()} ...",
                    progress and not cached), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)   # the line below says it once
            m = fastcall.module()
        if m is None:
            return (f"C++ call path: not built ({fastcall.build_error()}); eager calls take "
                    "the Python path")
        how = "cached" if cached else "built"
        return (f"C++ call path: {how} in {time.perf_counter() - t0:.2f} s -> "
                f"{fastcall.library_path()}")

    def tuning_space(self):
        return {"block_kv": (16, 32, 64), "buffers": (1, 2, 3), "warps": (4, 8),
                "rows_per_tile": (16, 32, 64), "split_kv": ("auto", 1, 2, 3, 4, 8),
                "split_cost": (1, 5, 20), "fp8_mma": ("dequant",), "fp8_converters": (1, 2),
                "fp8_raw_slots": (2, 3)}

    def verify_paths(self, s, device):
        # the 64-row kernel's cluster merge: batches of parts/4 < b <= parts/2 near-equal
        # requests (the profiles draw at most 8); the sparse kernel makes no cluster merge
        # (mla_wgmma.cuh), and a dense case would not fit its pages
        if (s.mapping.mainloop != "wgmma" or s.mapping.rows_per_tile != 64
                or s.problem.attention == "sparse"):
            return []
        import torch

        from . import scheduler
        from .ops import sm_count

        if not torch.cuda.is_available():
            return []
        lens = scheduler.cluster_lengths(s.heads_per_device, sm_count(torch.device(device)))
        return [("the cluster merge", dict(batch=len(lens), s_q=1, seqlens=tuple(lens)))] \
            if lens else []

    # a sequence with a bad block-table entry: its out and lse are NaN and the device flag
    # is set (api.check_device_errors), never an out-of-bounds read
    bad_pages_give_nan = True

    def runtime_shapes(self, s):
        # h_q and the page size are arguments of one build: query rows (s_q * h_q) against
        # the tile's rows decide how many tiles and how full the last one is; pages against
        # the 64-key block decide where a block's keys come from inside a page
        m, hpd, rows = s.mapping, s.heads_per_device, s.mapping.rows_per_tile
        heads = [h for h in (1, 2, 3, rows // 2 + 1, rows - 1, rows, rows + 1, 2 * rows + 3,
                             hpd - 1) if 1 <= h <= hpd and h != hpd]
        # (TMA boxes of 64 keys of a page: multiples of 64; gathered keys: any page)
        pages = ((64, 128, 192, 256) if m.mainloop == "wgmma" and not gathers_keys(s)
                 else (1, 16, 64, 96, 128, 256))
        page = s.problem.page_size
        # split_kv is a run-time knob of the one build: "auto" cuts a short batch over many
        # SMs into one-block pieces; fixed splits make pieces of several blocks, where a
        # piece's own rescale, its warpgroups' merge and its last page's check run
        splits = [x for x in (1, 3, 2) if x != m.split_kv]
        return {"heads": (hpd, *sorted(set(heads))),
                "page_size": (page, *[p for p in pages if p != page]),
                "split_kv": (m.split_kv, *splits)}

    def verify_pieces(self, s, seqlens, split_kv):
        # a fixed split's pieces, by the Python copy of the metadata kernel's arithmetic
        # ("auto" depends on the device's SM count and occupancy: not modelled here)
        if split_kv in (None, "auto"):
            return None
        from . import scheduler

        meta, ns = scheduler.plan_fixed(list(seqlens), int(split_kv))
        return [(pc.request, pc.start, pc.end)
                for pc in scheduler.pieces(list(seqlens), meta, ns)]

    def mutants(self):
        from .mutants import MUTANTS

        return MUTANTS

    def verify_family(self, s):
        # the other dtype (a template argument); the few-rows wgmma kernel's one- and
        # two-consumer forms (warps 4 / 8: the second merges the two warpgroups' states);
        # the mma.sync kernel's key blocks, stage counts and warps, each value once
        m = s.mapping
        other = {"dtype": "fp16" if s.problem.dtype == "bf16" else "bf16"}
        if m.mainloop == "wgmma":
            if s.problem.kv not in ("bf16", "fp16") and m.rows_per_tile == 64:
                return [other]   # the 64-row kernel's producer converts: no converter knobs
            if s.problem.kv not in ("bf16", "fp16"):
                # 8-bit caches: one consumer warpgroup; the converter's one- and
                # two-warpgroup forms (ds_mla's RoPE is bf16: no fp16 twin, the rules say);
                # conversion in registers (no converter): a shallower raw ring
                if m.fp8_converters == 0:
                    return [other, {"warps": 12 - m.warps},
                            {"fp8_raw_slots": 2 if m.fp8_raw_slots != 2 else 4}]
                return [other, {"fp8_converters": 3 - m.fp8_converters}]
            return [other] + ([{"warps": 12 - m.warps}] if m.rows_per_tile in (16, 32) else [])
        return [other, {"block_kv": 16, "buffers": 1}, {"block_kv": 64, "buffers": 3},
                {"warps": 12 - m.warps}]

    def verify_base(self):
        return dict(heads=128, tp=8, max_s_q=2, block_kv=32, buffers=2, rows_per_tile=64,
                    warps=8)

    def latent_decoder(self, weights, softmax_scale, **kw):
        from .latent import HopperLatent

        return HopperLatent(weights, softmax_scale, **kw)

    def api(self, name: str):
        from . import api

        return getattr(api, name)

    def bench_main(self, args) -> int:
        # --kv-format: with --shape, each shape in each format (bench.bench_main checks it)
        from .bench import bench_main

        return bench_main(args)

    def tune_main(self, args) -> int:
        from .tune import tune_main

        return tune_main(args)


BACKEND = HopperBackend()
