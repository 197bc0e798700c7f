"""The embedding worker: a sentence-embedding model on the CPU behind ``WorkerService.Embed``."""
