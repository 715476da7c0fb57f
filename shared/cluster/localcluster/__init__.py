"""A whole cluster on one machine: etcd and nats-server processes, the services as children, a run directory."""
