"""Preprocessor: chat template + tokenization + KV block hashes (see README.md)."""
