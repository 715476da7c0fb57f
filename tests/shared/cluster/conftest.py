"""Real etcd / nats-server fixtures for the control-plane tests."""

from __future__ import annotations

from tests.helpers.servers import etcd_server, nats_server  # noqa: F401
