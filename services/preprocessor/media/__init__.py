"""Image, video and audio input: fetched, decoded and placed in the prompt once per request (docs/architecture.md)."""
