"""The control plane: etcd registration + discovery, the NATS event bus, gRPC helpers, the local cluster.

    discovery:  shared.cluster.registration.Registrar   (an instance announces itself under a lease, with an epoch)
                shared.cluster.membership.Membership    (a watch-fed cache of who is there, survives etcd blips)
    events:     shared.cluster.bus                       (typed NATS channels: kv events, load, cancel, drain, scale)
    local:      shared.cluster.localcluster              (etcd + nats-server + services as child processes)

The lifecycle every role runs under (shared.service.lifecycle.Service) is built on these, one layer up.
Import the submodules directly; this package imports nothing heavy on its own.
"""
