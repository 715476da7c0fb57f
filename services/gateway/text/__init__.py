"""Text in and out of the gateway, shared by the HTTP and gRPC front doors.

tokenizer.py      prompt -> token ids: the HF tokenizer in-process, chat templates, token texts / bytes
fast_encode.py    byte-level BPE encoding without the Rust pipeline's per-call overhead
detokenizer.py    token-id deltas -> complete UTF-8 text, stop strings enforced
stop_strings.py   stop strings over streamed text (a match may span chunks)
generation.py     one request's trip through the backend: token-id chunks in, text deltas out
"""
