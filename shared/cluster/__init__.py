"""The control plane: etcd registration + discovery, the NATS event bus, gRPC helpers and the service lifecycle.

    discovery:  shared.cluster.registration.Registrar   (an instance announces itself under a lease, with an epoch)
                shared.cluster.membership.Membership    (a watch-fed cache of who is there, survives etcd blips)
    events:     shared.cluster.bus                       (typed NATS channels: kv events, load, cancel, drain, scale)
    lifecycle:  shared.cluster.lifecycle.Service         (gRPC server, health, register, ready handshake, drain)
    local:      shared.cluster.localcluster              (etcd + nats-server + services as child processes)

Import the submodules directly; this package imports nothing heavy on its own.
"""
