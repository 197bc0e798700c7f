"""The SGLang worker: SGLang's in-process engine behind WorkerService (``meshfront sglang``)."""
