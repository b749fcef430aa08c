"""Glue from model code into mlagen's operators (optional extras).

    mlagen.integrations.latent      the fused MLA decode of one card's heads on a paged latent
                                    cache, on a target kind (its backend's latent_decoder) or in torch
    mlagen.integrations.transformers  switches a transformers DeepseekV3 / DeepseekV2 model's
                                    attention to mlagen (pip install "mlagen[hf]")
"""
