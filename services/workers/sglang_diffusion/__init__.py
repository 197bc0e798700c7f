"""`meshfront sglang-diffusion`: SGLang diffusion serving (sglang.multimodal_gen) as a media engine."""
