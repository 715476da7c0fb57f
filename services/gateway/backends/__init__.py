"""What generates tokens behind the front doors, and the encoders behind /v1/embeddings.

    base.py              the seam: `GenerateBackend`, its request / chunk types and typed errors
    grpc_backend.py      the product backend: routed gRPC streams to the decode / worker instances (routing/)
    encoder_backend.py   Embed on the least-loaded encoder, retried elsewhere when one fails
    mock/                a fast, deterministic stand-in for the worker fleet (`python -m services.gateway.backends.mock`)
"""
