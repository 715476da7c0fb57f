"""`echo`: a tiny service with the real lifecycle and protos but no model, for control-plane tests,
`pdrelay up --echo N` and benchmarks (service.py)."""
