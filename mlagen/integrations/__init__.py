"""Glue from model code into mlagen's operators (optional extras).

    mlagen.integrations.latent      the fused MLA decode of one card's heads on a paged latent
                                    cache, on a target kind (its backend's latent_decoder) or in torch
    mlagen.integrations.sparse      token-sparse attention for model code: a model's picks as
                                    cache slots, the absorbed operator over the picked keys
    mlagen.integrations.transformers  switches a transformers DeepseekV3 / DeepseekV2 /
                                    DeepseekV32 model's attention to mlagen (pip install "mlagen[hf]")
    mlagen.integrations.transformers_pools  a DeepseekV4 layer: window and compressed pools
                                    in one softmax with sinks (enable() switches it)
"""
