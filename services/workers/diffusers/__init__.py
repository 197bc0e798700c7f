"""``meshfront diffusers``: Hugging Face diffusers pipelines behind MediaService (services/workers/media)."""
