"""A mock backend for the gateway: deterministic tokens without workers, for tests and the `--mock-workers`
serving benchmark. `python -m services.gateway.mock --port N` serves the real HTTP app over it."""
