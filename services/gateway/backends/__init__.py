"""What generates tokens behind the front doors, and the encoders behind /v1/embeddings, over the cluster.

    grpc_backend.py      the product `GenerateBackend`: a request's attempts until one completes, cancel over NATS
    attempt.py           Attempt: one try on one routing plan (route span, Decode.Generate, chunks, the verdict)
    retry_loop.py        RetryLoop: replay of what was sent, excluded instances, the retry budget, final errors
    grpc_metrics.py      Prometheus collector over that backend's counters, breakers, instances and KV index
    encoder_backend.py   Embed on the least-loaded encoder, retried elsewhere when one fails

The seam they implement is services/gateway/backend.py; the stand-in without workers is services/gateway/mock/.
"""
