"""The gateway: the OpenAI-compatible HTTP API and the gRPC Gateway API over the cluster's workers.

    service.py      wiring: both front doors over the routed gRPC backend, registered in etcd
    server.py       the HTTP app assembled from a resolved config (shared with the mock server)
    public_tls.py   the front doors' TLS; metrics.py the gateway's Prometheus metrics
    backend.py      the seam: `GenerateBackend` and its request / chunk / error types
    grpc/           the public gRPC API (pdrelay.v1.Gateway) and its API-key check
    http/           the OpenAI HTTP front door: routes, request / response bodies, validation, tools, media
    text/           tokenization, incremental detokenization, stop strings, one request's generation
    backends/       the gRPC backend to the decode / worker instances, the encoder backend for embeddings
    routing/        which instance serves a request: policies, KV index, breakers, discovery
    mock/           a deterministic backend without workers, and a server over it

Imports run one way, top to bottom (.importlinter checks it); the gateway never imports the engine.
"""
