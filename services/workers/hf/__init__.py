"""The hf worker: a real transformers causal LM on the CPU (needs the ``hf`` extra: torch)."""
