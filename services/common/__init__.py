"""What every Meshfront service shares: config flags, gRPC bootstrap, discovery, hashing."""
