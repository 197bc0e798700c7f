"""The postprocessor service: owns the token stream from a worker and turns it into text deltas."""
