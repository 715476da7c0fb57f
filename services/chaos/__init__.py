"""`pdrelay chaos`: fault scenarios against a live local cluster under a bounded, seeded load (see runner.py)."""
