"""A chat engine factory: see README.md."""
