"""`meshfront vllm-omni`: vLLM-Omni's diffusion stage (vllm_omni.Omni) as a media engine."""
