"""The gateway's media spine, shared by the Images and Videos APIs: the media worker client, the pipeline
(route, generate, release), the URL store (NATS JetStream Object Store) and multipart parsing."""
