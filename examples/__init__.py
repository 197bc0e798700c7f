"""Examples of Meshfront's extension points (docs/architecture.md, "Extension points")."""
