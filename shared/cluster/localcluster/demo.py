"""`pdrelay up --demo`: once the cluster is ready, ask its gateway one question and print the answer."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from shared.cluster.localcluster.child import Child


async def ask_demo_question(children: Sequence[Child], tls_dir: str | None, say: Callable[[str], None]) -> None:
    gw = next((c for c in children if c.role == "gateway" and c.ready and c.ready.http), None)
    if gw is None:
        say("pdrelay up --demo: no gateway with an HTTP API is running in this build; skipping the request")
        return
    import httpx

    scheme = "https" if tls_dir else "http"
    assert gw.ready is not None  # the search above only takes a ready gateway
    base = f"{scheme}://{gw.ready.http}"
    verify: str | bool = str(Path(tls_dir) / "ca.pem") if tls_dir else True
    try:
        async with httpx.AsyncClient(timeout=120, verify=verify) as client:
            models = (await client.get(f"{base}/v1/models")).json()["data"]
            body = {
                "model": models[0]["id"],
                "max_tokens": 32,
                "temperature": 0,
                "messages": [{"role": "user", "content": "What is the capital of France?"}],
            }
            r = await client.post(f"{base}/v1/chat/completions", json=body)
            r.raise_for_status()
            answer = r.json()["choices"][0]["message"]["content"]
        say(f"pdrelay up --demo: Q: What is the capital of France?\n  A: {answer.strip()}")
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as e:
        say(f"pdrelay up --demo: the request to {base} failed: {type(e).__name__}: {e}")
