"""mltrace.format: framing, CRCs, tensors, index JSON and paths, in isolation."""
