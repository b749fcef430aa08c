"""The SC11 target as one backend object (see mlagen/backends/base.py)."""

from __future__ import annotations

from ..base import Backend
from . import resources, rules
from .knobs import SCHEMES, Sc11Mapping


class Sc11Backend(Backend):
    kind = "sc11"
    mapping = Sc11Mapping
    target_file = "sc11.toml"
    default = True
    device = "cpu"
    rounded = ("q", "o_lat")          # the fused kernel stores these in bf16/fp16 (phases A, B)
    run_point = (128, 512)            # the seed's point
    foreign_why = {"split_kv": " (its multi-core scheme splits sequences; see scheme)"}
    # SDMA / GDMA move the format's bytes, the BDC dequantizes (templates/sc11/runtime/mla.h)
    # (fp8_ue8m0_paged: the sparse path only, rules.py)
    kv_formats = ("bf16", "fp16", "fp8_e4m3", "fp8_ds_mla", "fp8_ue8m0_paged")
    # token-sparse attention-only kernels (mla.h's sparse path: per-token SDMA gathers)
    attentions = ("dense", "sparse")
    sparse_kv_formats = ("bf16", "fp16", "fp8_ds_mla", "fp8_ue8m0_paged")

    def rules(self):
        return rules.RULES

    def resources(self, s, t):
        return resources.needs(s, t)

    def render(self, plan):
        from . import render

        return render(plan)

    def runner(self, plan, progress: "bool | None" = None):
        from . import runner

        return runner(plan, progress=progress)

    # softmax_scale is a problem knob but reaches the kernel as a run-time argument
    run_time_problem_knobs = ("softmax_scale",)

    def tuning_space(self):
        # every value the template compiles in (problem knobs included): block_kv 1 and 2
        # sit below s_q, page 64 above block_kv (tiles start mid-page)
        return {"block_kv": (1, 2, 16, 32, 64), "buffers": (1, 2, 3), "cores": (1, 2, 4, 8),
                "seq_tile": (32, 256, 512, 1024), "heads_per_core": (0, 1, 2, 4),
                "page_size": (1, 16, 64), "dtype": ("bf16", "fp16"), "max_s_q": (1, 2, 4),
                "kv_format": ("", "fp8_e4m3", "fp8_ds_mla"),
                "scheme": SCHEMES, "softmax_scale": (None, 0.0625, 0.4)}

    def verify_base(self):
        return dict(heads=128, tp=8, max_s_q=2, cores=8, block_kv=64, buffers=2, seq_tile=512)

    def mutants(self):
        from .mutants import MUTANTS

        return MUTANTS

    def verify_family(self, s):
        # every problem shape is compiled in: the builds that reach the kernel's branches
        # -- heads that leave the last core 2+ short (11 over 4 cores: 3, 3, 3, 2), cores
        # left idle, an explicit heads_per_core, key blocks below s_q (a query row seeing
        # no key in a split sequence), tiles starting mid-page, one and three buffers, the
        # other dtype
        tp = s.mapping.tp
        # sparse: small pages of both pools (a list's slots land on many pages, the pools'
        # page sizes differ) and short tiles (a list spans several, some all invalid); the
        # gather a descriptor a token (the other value of `gather`)
        other = "token" if s.mapping.gather == "runs" else "runs"
        sparse = [dict(page_size=16, block_kv=16, seq_tile=64,
                       **({"extra_page_size": 2} if s.problem.extra_topk else {})),
                  dict(gather=other)] if s.problem.attention == "sparse" else []
        return sparse + [dict(heads=tp * 11, cores=4, heads_per_core=0),
                dict(heads=tp * 6, cores=8, heads_per_core=0),
                dict(heads=tp * 12, cores=8, heads_per_core=2),
                dict(block_kv=2, max_s_q=4, seq_tile=32),
                dict(buffers=1, block_kv=16, seq_tile=256),
                dict(buffers=3, block_kv=32),
                dict(dtype="fp16" if s.problem.dtype == "bf16" else "bf16")]

    def runtime_choices(self, s):
        return {"scheme": SCHEMES} if s.mapping.scheme == "auto" else {}

    def boundary_tile(self, s):
        return s.mapping.seq_tile

    def run_kwargs(self, scheme):
        if scheme is not None and scheme not in SCHEMES:
            from ...errors import MlagenError, clip

            raise MlagenError(f"--scheme {clip(repr(scheme))} must be one of {', '.join(SCHEMES)}")
        return {"scheme": scheme}

    def report(self, plan, outputs, chart):
        from .report import report

        report(plan, outputs, chart)

    def bench_main(self, args) -> int:
        from .bench import bench_main

        return bench_main(args)

    def latent_decoder(self, weights, softmax_scale, **kw):
        from .latent import Sc11Latent

        return Sc11Latent(weights, softmax_scale, **kw)

    def tp_rank_info(self, plan, outputs):
        from .costmodel import Machine, simulate

        return {"kernel_s": simulate(outputs.extra["trace"],
                                     Machine.from_target(plan.target)).total_s,
                "scheme": outputs.extra.get("scheme")}

    def tp_report(self, plan, infos, tokens):
        from .collective import tp_step

        print(f"phase-B scheme: {infos[0].get('scheme')}")
        print(tp_step([i["kernel_s"] for i in infos], tokens, plan.target).summary())


BACKEND = Sc11Backend()
