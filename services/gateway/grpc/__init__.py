"""The gateway's public gRPC API (proto pdrelay.v1.Gateway), the same front door as the HTTP API.

api.py    Generate, Tokenize, ListModels, Health: requests validated by the HTTP layer's own checks
auth.py   `--api-key` as `authorization: Bearer <key>` metadata on every call
"""
