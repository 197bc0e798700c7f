"""POST /v1/embeddings: OpenAI's embeddings API over the mesh (gateway -> preprocessor -> router -> worker)."""
