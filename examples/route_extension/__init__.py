"""A route extension: see README.md."""
