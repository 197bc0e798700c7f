"""Offline model directories for the demo and the tests (see build.py)."""

from services.models.build import build_demo_model, default_test_model_dir

__all__ = ["build_demo_model", "default_test_model_dir"]
