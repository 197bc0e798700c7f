"""Meshfront benchmarks: a low-overhead streaming load generator and per-process CPU accounting.

``python -m bench mesh`` starts a fresh mesh per shape (split services or in-process stages),
drives it with closed-loop streaming chat requests at several concurrency levels and reports
latency percentiles next to the CPU milliseconds each server process spent per request.
"""
