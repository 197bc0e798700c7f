"""The Videos API: OpenAI jobs and Dynamo's synchronous video generation (docs/media.md)."""
