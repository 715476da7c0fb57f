"""A whole cluster on one machine: etcd and nats-server processes, the services as children, a run directory.

service_process.ServiceProcess is the one way the benchmarks and the tests start a single service and wait for it.
"""
