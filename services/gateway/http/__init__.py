"""The OpenAI-compatible HTTP front door: an ASGI app over a `GenerateBackend`, without a web framework.

app.py             routes: /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics, /openapi.json
asgi.py            body reading with a size limit, responses, cancellation when the client disconnects
json_body.py       JSON body -> its request Struct
api_requests.py    request bodies of the OpenAI API (msgspec Structs)
api_responses.py   response bodies; /openapi.json is generated from them
validation.py      value checks on a decoded request -> the backend's Plan (shared with the gRPC API)
structured.py      response_format / structured_outputs -> one StructuredSpec, checked up front
errors.py          OpenAI-style error bodies for every failure
formatters.py      text deltas -> response bodies, streamed (SSE) or whole
batch.py           several prompts in one completions request
tokenize_api.py    /tokenize and /detokenize (vLLM's shape)
embeddings.py      /v1/embeddings and gRPC Gateway.Embed over the encoders
openapi.py         /openapi.json; openapi_limits.py adds validation.py's value rules to it
tools/             tool calling in chat: the tool spec, rendering into the prompt, parsing calls out
media/             image parts in chat messages: fetch, decode, preprocess into the prompt's images
"""
