"""KServe v2 (Triton) gRPC frontend: ``inference.GRPCInferenceService`` on the gateway's server."""
