"""Tensor parallelism inside one instance: a process per rank, the model's heads, MLP and vocabulary split over
them (shard.py), their collectives (comm.py, group.py), rank 0's runner that broadcasts each step's batch
(runner.py, batch_wire.py) and the other ranks' loop (follower.py), started by ranks.py.

Nothing here is imported on the --tp-size 1 path: that stays the single-process engine, untouched.
"""
