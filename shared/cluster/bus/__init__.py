"""The NATS event bus: typed msgspec messages on named subjects, one module per channel.

client.py     Bus: connect, publish (never raises; buffers or drops during an outage), typed subscribe
subjects.py   subject names: pdrelay.<cluster>.{kv,load,drain}.<instance>, pdrelay.<cluster>.cancel, ...
kv_events.py  pages stored / evicted (chained block hashes), from the engine's prefix-cache callback
kv_snapshot.py an instance's cached block hashes at a sequence number (request/reply), to rebuild a KV index
kv_index_status.py a gateway's KV index state per instance (request/reply), for `pdrelay status`
load.py       load reports every ~200 ms (running, queued, free pages, tokens/s)
cancel.py     cancellations by request id
drain.py      drain commands to one instance
scale.py      `pdrelay scale` requests to the local-cluster supervisor (request/reply)
"""
