"""The vLLM worker: vLLM's async engine in-process behind WorkerService (``meshfront vllm``)."""
