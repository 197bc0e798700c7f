"""Inference workers: the generic WorkerService glue plus one package per engine (mocker, hf)."""
