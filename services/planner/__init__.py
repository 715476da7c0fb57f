"""The planner: scales prefill and decode separately against TTFT / ITL targets (see service.py)."""
