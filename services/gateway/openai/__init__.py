"""The OpenAI API below both front doors: what the HTTP API (http/) and the gateway's gRPC API (grpc/) accept and
answer, decided once.

    requests.py     the request bodies (msgspec types, OpenAI's and vLLM's field names)
    planning.py     a request -> Plan: every value checked (4xx naming the field), sampling parameters, the
                    structured-output and tool specs, images; the one place both front doors validate
    structured.py   response_format / structured_outputs -> a grammar spec checked by xgrammar
    tools/          tool definitions and tool_choice (spec.py), their prompt (render.py), calls in the output
                    (parse.py)
    media_parts.py  image parts of chat messages
    responses.py    the response bodies
    errors.py       ApiError (an OpenAI error body and its status) and the backend errors' mapping
"""
