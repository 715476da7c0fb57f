"""What generates tokens behind the front doors, and the encoders behind /v1/embeddings, over the cluster.

    grpc_backend.py      the product `GenerateBackend`: routed gRPC streams to the decode / worker instances
                         (routing/ decides which), retries, cancel over NATS
    grpc_metrics.py      Prometheus collector over that backend's counters, breakers, instances and KV index
    encoder_backend.py   Embed on the least-loaded encoder, retried elsewhere when one fails

The seam they implement is services/gateway/backend.py; the stand-in without workers is services/gateway/mock/.
"""
