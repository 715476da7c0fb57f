"""The gateway: OpenAI-compatible HTTP front door, tokenization, incremental detokenization, routing."""
