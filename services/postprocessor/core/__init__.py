"""Pure postprocessing logic: no gRPC, no protobuf; tokenizers are the Rust ``tokenizers`` library."""
