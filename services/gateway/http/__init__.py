"""The OpenAI-compatible HTTP front door: an ASGI app over a `GenerateBackend`, without a web framework. What the
API accepts and answers is decided below it, in services/gateway/openai/ (shared with the gRPC API).

app.py             routes: /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics, /openapi.json
asgi.py            body reading with a size limit, responses, cancellation when the client disconnects
json_body.py       JSON body -> its request Struct
formatters.py      text deltas -> response bodies, streamed (SSE) or whole; tool_formatter.py for tool calls
batch.py           several prompts in one completions request
tokenize_api.py    /tokenize and /detokenize (vLLM's shape)
embeddings.py      /v1/embeddings and gRPC Gateway.Embed over the encoders
openapi.py         /openapi.json; openapi_limits.py adds the planning's value rules to it
media/             image parts in chat messages: fetch, decode, preprocess into the prompt's images
"""
