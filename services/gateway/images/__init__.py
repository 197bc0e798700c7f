"""POST /v1/images/generations and /v1/images/edits: OpenAI's Images API (and Dynamo's nvext) over the mesh
(gateway -> router -> media worker; the spine is services/gateway/media/)."""
