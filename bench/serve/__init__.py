"""The serving benchmark (`pdrelay bench serve`, `python -m bench.serve`): main.py parses the flags and runs the
phases; client/http_client stream requests, datasets/mm build prompts, runner paces them, metrics/report turn the
results into vLLM-keyed tables; compare, peer, policies and kvstore are the side-by-side modes; procs measures CPU.
"""
