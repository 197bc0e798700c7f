"""OpenAI protocol core: request validation, proto conversion, response shapes. No grpc."""
