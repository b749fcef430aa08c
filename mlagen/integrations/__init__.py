"""Glue from model code into mlagen's operators (optional extras).

    mlagen.integrations.latent      the fused MLA decode of one card's heads on a paged latent
                                    cache, on a target (sc11 emulator, hopper, or torch)
    mlagen.integrations.transformers  switches a transformers DeepseekV3 / DeepseekV2 model's
                                    attention to mlagen (pip install "mlagen[hf]")
"""
